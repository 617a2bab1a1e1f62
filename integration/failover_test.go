package integration

import (
	"bytes"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
)

// cliProc is a brood client verb run as its own process, with its stdout,
// stderr and exit status once it ended.
type cliProc struct {
	out, err syncBuf
	done     chan struct{}
	code     int
}

// syncBuf is a buffer a process writes while the test reads it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(b)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func runCLI(t *testing.T, args ...string) *cliProc {
	t.Helper()
	c := &cliProc{done: make(chan struct{})}
	cmd := exec.Command(broodBin, args...)
	cmd.Stdout, cmd.Stderr = &c.out, &c.err
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = cmd.Wait()
		c.code = cmd.ProcessState.ExitCode()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
	})
	return c
}

// TestWaitingVerbsGoOnThroughAnotherCoordinator: `brood followup --wait`
// and `brood log --follow` long-poll a coordinator for the child's log;
// when that coordinator is killed (SIGKILL) with their request in flight,
// they ask again, reach the coordinator that runs by then, and end with the
// turn's real answer, exit 0 (issue 37, item 1). Before, the lost long
// poll's UNAVAILABLE was the command's exit, the answer and later events
// lost to the user.
func TestWaitingVerbsGoOnThroughAnotherCoordinator(t *testing.T) {
	s := stack.New(t)
	url := s.Server.ClientURL()
	c1 := startProc(t, "coordinator", "--nats", url, "--log-level", "info",
		"--heartbeat", stack.Heartbeat.String(), "--host-expiry", stack.HostExpiry.String())
	c1.waitStderr(t, "coordinator serving", 30*time.Second)
	s.AddSpawnWorker()
	root := s.Root()
	start := startCont(t, s, root.Ref(), "say ready")
	waitIdle := func() {
		t.Helper()
		waitState(t, s, start.ChildID, ref(root), "none", 30*time.Second)
	}
	waitIdle()

	// --timeout 3s: a long poll lost with its coordinator times out 3 s
	// after its wait (10 s for followup --wait, 0.5 s for log --follow).
	wait := runCLI(t, "followup", start.ChildID, "sleep 4s\nsay late", "--wait", "--progress", "never", "--nats", url, "--timeout", "3s")
	testutil.Eventually(t, 30*time.Second, func() bool { return strings.Contains(wait.err.String(), "messageId ") }, "followup --wait sent its message")
	follow := runCLI(t, "log", start.ChildID, "--follow", "--nats", url, "--timeout", "3s")
	testutil.Eventually(t, 30*time.Second, func() bool { return strings.Contains(follow.out.String(), "sleep 4s") }, "log --follow shows the turn's message")

	// The only coordinator, serving both long polls, dies; another starts.
	c1.signal(t, syscall.SIGKILL)
	s.AddCoordinator()

	deadline := time.After(client.DefaultOutageMax + 30*time.Second)
	for _, v := range []struct {
		name string
		p    *cliProc
		want func(out string) bool
	}{
		{"followup --wait", wait, func(out string) bool { return out == "late\n" }},
		{"log --follow", follow, func(out string) bool { return strings.Contains(out, "late") }},
	} {
		select {
		case <-v.p.done:
		case <-deadline:
			t.Fatalf("%s still runs after the failover\nstderr: %s", v.name, v.p.err.String())
		}
		if v.p.code != 0 || !v.want(v.p.out.String()) {
			t.Fatalf("%s: exit %d\nstdout: %s\nstderr: %s", v.name, v.p.code, v.p.out.String(), v.p.err.String())
		}
	}
}
