package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/embedded"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// outageHeld is how long a test keeps the broker down: longer than the two
// reconnect tries (2 s apart, nats.go's default wait) client verbs used to
// make before their connection closed for good.
const outageHeld = 8 * time.Second

// startBroker starts an embedded server on port over dir (the same data on
// a restart).
func startBroker(t *testing.T, port int, dir string) *embedded.Server {
	t.Helper()
	srv, err := embedded.Start(embedded.Config{Host: "127.0.0.1", Port: port, DataDir: dir, ServerName: "restart"})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// TestRunOutlivesABrokerRestart: `brood run` waiting on a run while the
// broker restarts on the same data (as Ctrl-C and a new `brood dev` do)
// reconnects and ends with the run's real outcome, the one runs.await
// records, or with UNAVAILABLE, within client.DefaultOutageMax of the
// outage (issue 37, item 1). Before, its connection gave up after two
// reconnect tries and the command waited until Ctrl-C.
func TestRunOutlivesABrokerRestart(t *testing.T) {
	dir := t.TempDir()
	port, err := embedded.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	srv := startBroker(t, port, dir)
	s := stack.On(t, srv)
	s.AddCoordinator()
	s.AddSpawnWorker()
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- execute([]string{"run", "--provider", "spawn", "sleep 2s\nsay after the outage", "--nats", srv.ClientURL()}, &out, &errb)
	}()
	testutil.Eventually(t, 30*time.Second, func() bool { return strings.Contains(errb.String(), "child ") }, "brood run starts its child")
	child := strings.Fields(errb.String())[1]

	srv.Shutdown()
	time.Sleep(outageHeld) // the outage itself, not a wait for a condition
	srv = startBroker(t, port, dir)
	t.Cleanup(srv.Shutdown)

	var code int
	select {
	case code = <-done:
	case <-time.After(client.DefaultOutageMax + 30*time.Second):
		t.Fatalf("brood run still waits %s after the broker came back\nstderr: %s", client.DefaultOutageMax+30*time.Second, errb.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var st protocol.RunStatus
	testutil.Eventually(t, 60*time.Second, func() bool {
		st, err = s.Client.Await(ctx, protocol.RunRef{RunID: child, Grant: s.Grant().Grant, WaitMs: 1000})
		return err == nil && st.State == protocol.RunSettled && st.Result != nil
	}, "the run settles after the restart")
	res := *st.Result
	switch {
	case code == 0:
		if res.StopReason != protocol.StopCompleted || out.String() != "after the outage\n" {
			t.Fatalf("brood run exit 0 printing %q; the run settled %s %q", out.String(), res.StopReason, res.Diagnostic)
		}
	case strings.Contains(errb.String(), "\nUNAVAILABLE: "):
		t.Logf("brood run gave up with UNAVAILABLE; the run settled %s", res.StopReason)
	default:
		want := string(res.ErrorCode)
		if want == "" {
			want = strings.ToUpper(string(res.StopReason))
		}
		if code != 1 || !strings.Contains(errb.String(), "\n"+want+": run ") {
			t.Fatalf("brood run exit %d, stderr %q; the run settled %s %s %q", code, errb.String(), res.StopReason, res.ErrorCode, res.Diagnostic)
		}
	}
}
