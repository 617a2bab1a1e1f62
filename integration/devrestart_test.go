package integration

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
)

// broodCLI runs `brood args... --nats url` and returns its stdout; it fails
// the test when the verb does not exit 0 within 2 minutes.
func broodCLI(t *testing.T, url string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, broodBin, append(args, "--nats", url)...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = t.TempDir(), &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("brood %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return strings.TrimSpace(stdout.String())
}

// field returns the value of the line "name value" of a verb's output.
func field(t *testing.T, out, name string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s line in %q", name, out)
	return ""
}

// devTurnEnds returns the turn/end events of a session's log, with when each
// was logged (epoch ms), read through the coordinator at url.
func devTurnEnds(t *testing.T, url, id string) (ends []protocol.TurnEndReason, at []int64) {
	t.Helper()
	for _, ev := range devLog(t, url, id) {
		if ev.Type == protocol.EvTurnEnd {
			var d protocol.TurnEndData
			if err := ev.Decode(&d); err != nil {
				t.Fatal(err)
			}
			ends, at = append(ends, d.Reason), append(at, ev.Time)
		}
	}
	return ends, at
}

// TestDevStopGivesTurnsTheirGraceAndQueuedMessagesRunAfterRestart: stopping
// `brood dev` (Ctrl-C) gives in-flight turns 10 s (worker.DefaultDrainGrace)
// to finish, then ends them aborted; everything stops at once, and after the
// next start on the same data the messages queued before the stop run
// (README, "Steer children"; docs/protocol.md §10).
func TestDevStopGivesTurnsTheirGraceAndQueuedMessagesRunAfterRestart(t *testing.T) {
	data := t.TempDir()
	d := startDev(t, "--data", data)
	url := d.natsURL
	// long does not finish within the grace, and has a message queued
	// behind its turn; short, started last, finishes within it.
	long := field(t, broodCLI(t, url, "start", "--provider", "spawn", "sleep 300s\nsay never"), "childId")
	broodCLI(t, url, "followup", long, "say after the restart")
	short := field(t, broodCLI(t, url, "start", "--provider", "spawn", "sleep 8s\nsay finished within the grace"), "childId")
	for _, id := range []string{short, long} {
		testutil.Eventually(t, 30*time.Second, func() bool { return broodCLI(t, url, "state", id) == protocol.StateRunning }, "%s runs", id)
	}
	if ends, _ := devTurnEnds(t, url, short); len(ends) != 0 {
		t.Fatalf("the short turn ended before the stop (%v): the test needs it in flight", ends)
	}
	stopAt := time.Now()
	if err := d.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.done:
	case <-time.After(worker.DefaultDrainGrace + 60*time.Second):
		t.Fatalf("brood dev still runs %v after Ctrl-C", worker.DefaultDrainGrace+60*time.Second)
	}
	took := time.Since(stopAt)
	if code := d.cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(d.Stdout(), "brood dev: drained and stopped") {
		t.Fatalf("brood dev after Ctrl-C: exit %d, stdout:\n%s", code, d.Stdout())
	}
	// The 300 s turn held the stop for the whole grace, not longer than it
	// takes to end it.
	if took < worker.DefaultDrainGrace-time.Second {
		t.Fatalf("brood dev stopped %v after Ctrl-C with a turn in flight: the grace is %v", took, worker.DefaultDrainGrace)
	}

	// Everything starts again on the same data.
	d2 := startDev(t, "--data", data)
	url = d2.natsURL
	ends, at := devTurnEnds(t, url, short)
	if len(ends) != 1 || ends[0].Kind != protocol.TurnCompleted || at[0] < stopAt.UnixMilli() {
		t.Fatalf("the short turn (in flight at the stop): ends %+v at %v, stop at %d; want one completed after the stop", ends, at, stopAt.UnixMilli())
	}
	if got := broodCLI(t, url, "result", short); got != "finished within the grace" {
		t.Fatalf("brood result %s = %q", short, got)
	}
	// The long turn ended aborted; the message queued behind it runs now.
	if got := broodCLI(t, url, "result", "--wait", long); got != "after the restart" {
		t.Fatalf("brood result --wait %s = %q, want the queued message's answer", long, got)
	}
	ends, _ = devTurnEnds(t, url, long)
	if len(ends) != 2 || ends[0].Kind != protocol.TurnAborted || ends[1].Kind != protocol.TurnCompleted {
		t.Fatalf("the long child's turns ended %+v; want aborted (the stop), then completed (the queued message)", ends)
	}
}
