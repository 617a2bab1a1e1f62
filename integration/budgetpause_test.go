package integration

import (
	"encoding/json"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestDevRestartedWhileAChildIsPausedAtItsBudget (issue 32's acceptance:
// "A continuable child at its cap shows `paused`, survives a kill -9 and
// restart of `brood dev`, and after `brood budget --raise` completes the
// same turn"): a continuable child pauses at its budget's cap, before its
// second model request (a budget of one) or before a step's two tool
// calls (a budget of one tool call); `brood state` and `brood children`
// say paused; `brood dev` is killed with -9 and started again on the same
// data; the child is paused again on the same request; `brood budget
// --raise` continues the turn, which completes: one turn, one turn end,
// its request opened and answered once.
func TestDevRestartedWhileAChildIsPausedAtItsBudget(t *testing.T) {
	for _, tt := range []struct {
		name, limit, prompt, trail string
		step                       int64
	}{
		{"before a model request", "modelRequests", "call read_file {\"path\":\"nothing.txt\"}\nsay done",
			"tool/call tool/result request/open request/answer", 2},
		{"before a step's tool calls", "toolCalls", "call read_file {\"path\":\"nothing.txt\"}\ncall read_file {\"path\":\"nothing.txt\"}\nsay done",
			"tool/call tool/call request/open request/answer tool/result tool/result", 1},
	} {
		t.Run(tt.name, func(t *testing.T) { devRestartWhilePaused(t, tt.limit, tt.prompt, tt.trail, tt.step) })
	}
}

func devRestartWhilePaused(t *testing.T, limit, prompt, wantTrail string, step int64) {
	data, ws := t.TempDir(), t.TempDir()
	d := startDev(t, "--data", data)
	out := broodAt(t, ws, d.natsURL, "start", "--provider", "spawn", "--budget", limit+"=1", prompt)
	child := ""
	for _, line := range strings.Split(out, "\n") {
		if id, ok := strings.CutPrefix(line, "childId "); ok {
			child = id
		}
	}
	if child == "" {
		t.Fatalf("brood start printed no childId: %q", out)
	}
	testutil.Eventually(t, 30*time.Second, func() bool {
		return broodAt(t, ws, d.natsURL, "state", child) == protocol.StatePaused
	}, "brood state says the child is paused")
	pausedRow := func(url string) bool {
		var rows []protocol.ChildRow
		if json.Unmarshal([]byte(broodAt(t, ws, url, "children", "--json")), &rows) != nil {
			return false
		}
		for _, r := range rows {
			if r.ID == child {
				return r.State == protocol.StatePaused
			}
		}
		return false
	}
	if !pausedRow(d.natsURL) {
		t.Fatal("brood children does not list the child paused")
	}
	if got := broodAt(t, ws, d.natsURL, "budget", child); !strings.Contains(got, child+"  "+limit+"  1") {
		t.Fatalf("brood budget printed:\n%s\nwant its %s limit of 1", got, limit)
	}
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.done:
	case <-time.After(time.Minute):
		t.Fatal("brood dev still runs a minute after kill -9")
	}

	d2 := startDev(t, "--data", data)
	url := d2.natsURL
	testutil.Eventually(t, 30*time.Second, func() bool {
		// Until the dead host is found gone, the state call may find
		// nobody serving it (UNAVAILABLE, exit 1): asked again.
		st, err := exec.Command(broodBin, "state", child, "--nats", url).Output()
		return err == nil && strings.TrimSpace(string(st)) == protocol.StatePaused && pausedRow(url)
	}, "the child is paused again after the restart")
	if got := broodAt(t, ws, url, "budget", child, "--raise", limit+"=+1"); !strings.Contains(got, limit+"  2") {
		t.Fatalf("brood budget --raise printed:\n%s\nwant the %s limit 2", got, limit)
	}
	var evs []protocol.SessionEvent
	testutil.Eventually(t, 30*time.Second, func() bool {
		evs = devLog(t, url, child)
		_, _, ends, _ := parkedTrail(evs, "read_file")
		return len(ends) > 0
	}, "the raised turn ends")
	trail, starts, ends, _ := parkedTrail(evs, "read_file")
	if starts != 1 || strings.Join(ends, ",") != protocol.TurnCompleted {
		t.Fatalf("%d turns, ends %v; want the one turn, continued and completed", starts, ends)
	}
	var order []string
	for _, typ := range trail {
		if typ != protocol.EvAgentTakeover {
			order = append(order, typ)
		}
	}
	if strings.Join(order, " ") != wantTrail {
		t.Fatalf("log trail %v; want %s", trail, wantTrail)
	}
	for _, ev := range evs {
		var d protocol.RequestOpenData
		if ev.Type == protocol.EvRequestOpen && (ev.Decode(&d) != nil || d.Kind != protocol.RequestBudget || d.Turn != 1 || d.Step != step) {
			t.Fatalf("request/open %+v; want a budget pause of turn 1 at step %d", d, step)
		}
	}
	if got := broodAt(t, ws, url, "state", child); got == protocol.StatePaused {
		t.Fatal("brood state still says paused after the turn completed")
	}
}
