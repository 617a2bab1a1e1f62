package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
)

// cli is a Brood deployment inside the test process (an embedded server, a
// coordinator, the spawn and fork providers) and the brood command line run
// against it in-process, so each verb's output and exit status are checked
// as a user sees them.
type cli struct {
	t     *testing.T
	stack *stack.Stack
	url   string
}

func newCLI(t *testing.T) *cli {
	t.Helper()
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	s.AddForkWorker()
	return &cli{t: t, stack: s, url: s.Server.ClientURL()}
}

// outcome is one command's stdout, stderr and exit status.
type outcome struct {
	out, err string
	code     int
}

// run runs `brood args... --nats URL` (a verb that takes no --nats is run
// with runBare).
func (c *cli) run(args ...string) outcome {
	c.t.Helper()
	return c.runBare(append(args, "--nats", c.url)...)
}

func (c *cli) runBare(args ...string) outcome {
	c.t.Helper()
	var out, errb bytes.Buffer
	code := execute(args, &out, &errb)
	return outcome{out: out.String(), err: errb.String(), code: code}
}

// ok runs a verb that must succeed and returns its stdout.
func (c *cli) ok(args ...string) outcome {
	c.t.Helper()
	o := c.run(args...)
	if o.code != 0 {
		c.t.Fatalf("brood %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), o.code, o.out, o.err)
	}
	return o
}

// fails runs a verb that must fail with code first on stderr and exit 1.
func (c *cli) fails(code string, args ...string) outcome {
	c.t.Helper()
	o := c.run(args...)
	if o.code != 1 || !strings.HasPrefix(o.err, code+": ") {
		c.t.Fatalf("brood %s: exit %d, stderr %q; want exit 1 and %s first", strings.Join(args, " "), o.code, o.err, code)
	}
	return o
}

func decodeJSON[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, s)
	}
	return v
}

// field returns the value after "name " on a line of the form "name value".
func field(t *testing.T, out, name string) string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %q line in %q", name, out)
	return ""
}

// eventually polls cond with the CLI until it holds (a generous deadline for
// loaded CI machines).
func (c *cli) eventually(what string, cond func() bool) {
	c.t.Helper()
	testutil.Eventually(c.t, 20*time.Second, cond, "%s", what)
}
