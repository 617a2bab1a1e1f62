package provider_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/dev"
)

// exampleBuildTimeout bounds the scratch module's build (a loaded machine
// compiles nats.go and the SDK's dependencies from the module cache).
const exampleBuildTimeout = 5 * time.Minute

// buildExample builds examples/echo as a third party would: in a scratch
// module of its own that requires this module (a replace directive points
// at the repository) and imports nothing of it but pkg/provider. Its
// requirements come from the module cache (GOFLAGS=-mod=mod, the
// repository's go.sum; no network beyond the Go proxy).
func buildExample(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	natsVersion, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/nats-io/nats.go").Output()
	if err != nil {
		t.Fatalf("go list -m nats.go: %v", err)
	}
	src, err := os.ReadFile(filepath.Join(root, "pkg/provider/examples/echo/main.go"))
	if err != nil {
		t.Fatal(err)
	}
	// The example imports the SDK and nats.go only (and the standard
	// library): a third party's program could not import more of Brood.
	for _, line := range strings.Split(string(src), "\n") {
		if imp := strings.TrimSpace(line); strings.Contains(imp, `"github.com/brood-dev/brood/`) && imp != `"github.com/brood-dev/brood/pkg/provider"` {
			t.Fatalf("the example imports %s, not only pkg/provider", imp)
		}
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module example.com/echo\n\ngo 1.26.0\n\nrequire (\n\tgithub.com/brood-dev/brood v0.0.0-00010101000000-000000000000\n\tgithub.com/nats-io/nats.go " +
		strings.TrimSpace(string(natsVersion)) + "\n)\n\nreplace github.com/brood-dev/brood => " + root + "\n"
	for name, data := range map[string][]byte{"go.mod": []byte(gomod), "go.sum": sum, "main.go": src} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), exampleBuildTimeout)
	defer cancel()
	bin := filepath.Join(dir, "echo")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("the example does not build in a scratch module: %v\n%s", err, out)
	}
	return bin
}

// TestExampleProviderInScratchModule builds the echo example outside the
// module and runs it against a deployment (services/dev, as `brood dev`):
// a one-shot run and a continuable child with a followup are answered by
// it, and it drains on SIGTERM with exit status 0.
func TestExampleProviderInScratchModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	defer goleak.VerifyNone(t)
	bin := buildExample(t)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := dev.Start(ctx, dev.Config{DataDir: t.TempDir(), Providers: []string{"echo"}, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "--nats", d.URL())
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()

	nc, err := nats.Connect(d.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cl, err := client.New(nc, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, func() bool {
		r, err := cl.Providers(ctx)
		return err == nil && r.Instances["echo"] > 0
	}, "the echo provider is not listed (stderr: %s)", &stderr)

	root, err := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close(context.Background())

	run, err := cl.StartRun(ctx, protocol.RunStartRequest{Provider: "echo", Parent: root.Ref(), Prompt: protocol.Text("hello")})
	if err != nil {
		t.Fatal(err)
	}
	res, err := run.Result(ctx)
	if err != nil {
		t.Fatalf("one-shot run: %v", err)
	}
	if got := protocol.PlainText(res.Output); got != "echo 1: hello" || res.StopReason != protocol.StopCompleted {
		t.Fatalf("one-shot run answered %q (%s), want %q (completed)", got, res.StopReason, "echo 1: hello")
	}

	start, err := cl.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "echo", Parent: root.Ref(), Label: "echoer", Prompt: protocol.Text("first")})
	if err != nil {
		t.Fatal(err)
	}
	var last lastAnswer
	answer := func() string {
		r, err := cl.SessionResult(ctx, protocol.SessionResultRequest{SessionID: start.ChildID, Authority: root.Authority()})
		last.s = protocol.PlainText(r.Output)
		if err != nil || !r.Finished {
			last.s = "(none yet)"
		}
		return last.s
	}
	testutil.Eventually(t, time.Minute, func() bool { return answer() == "echo 1: first" }, "the continuable child's first turn answered %s", &last)
	if _, err := cl.Followup(ctx, protocol.FollowupRequest{ChildID: start.ChildID, Authority: root.Authority(), Message: protocol.Text("second")}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, func() bool { return answer() == "echo 2: second" }, "the followup answered %s", &last)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the example did not drain cleanly: %v\n%s", err, &stderr)
		}
	case <-time.After(time.Minute):
		t.Fatalf("the example did not exit within a minute of SIGTERM\n%s", &stderr)
	}
	if !strings.Contains(stdout.String(), "serving echo as host echo.") {
		t.Errorf("stdout %q does not name the host", stdout.String())
	}
}

// lastAnswer shows the last answer polled in a failure message.
type lastAnswer struct{ s string }

func (l *lastAnswer) String() string { return l.s }
