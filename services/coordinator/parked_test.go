package coordinator_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// TestAParkedTurnOutlivesItsWorkersDrain (issue 33, item 1; docs/protocol.md
// §5.21, "After a restart"): a grandchild (root → continuable child →
// continuable grandchild) parks a run_command call on a request; its only
// worker drains (a graceful stop) and the turn is left parked, nothing
// logged; a new worker comes up, and the parked sweep resumes the
// grandchild without anyone reading or answering the request. Approved,
// the same turn goes on: the command runs once and the turn completes.
// A request no one reads past its deadline is timed out by the sweep, and
// its turn goes on with the timeout as its result.
func TestAParkedTurnOutlivesItsWorkersDrain(t *testing.T) {
	tests := []struct {
		name    string
		timeout time.Duration // the coordinator's request timeout
		answer  bool          // approve once resumed; else wait for the timeout
		ran     bool
		result  string
	}{
		{"approved once resumed", time.Hour, true, true, "exit status 0"},
		{"timed out while no worker served it", 3 * time.Second, false, false, "timed out"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := stack.New(t)
			s.AddCoordinator(func(c *coordinator.Config) {
				c.RequestTimeout, c.ParkedSweepInterval, c.LivenessInterval = tt.timeout, 300*time.Millisecond, 300*time.Millisecond
			})
			_, stopWorker := s.AddSpawnWorker()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			ws := t.TempDir()
			root := s.Root(ws)
			grandchild := `call run_command {"command":"echo ran >> ran.txt"}` + "\nsay done"
			if _, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "child",
				Prompt: protocol.Text(background(t, grandchild) + "\nsay started")}); err != nil {
				t.Fatal(err)
			}
			req := pendingRequest(t, s)
			gc := req.SessionID
			first, err := s.Store.LeaseLatest(ctx, gc)
			if err != nil {
				t.Fatalf("the parked grandchild's lease: %v", err)
			}
			stopWorker() // its drain leaves the turn parked
			_, evs := s.Log(gc)
			if p, ends := parkedEnds(evs); p != "tool/call request/open" || len(ends) != 0 {
				t.Fatalf("after the drain: %s, ends %v; want the turn still open, parked", p, ends)
			}
			if !tt.answer {
				testutil.Eventually(t, 30*time.Second, func() bool {
					r, err := s.Store.Request(ctx, req.ID)
					return err == nil && r.Value.State == protocol.RequestTimedOut
				}, "the sweep times the request out while no one reads it")
			}
			s.AddSpawnWorker()
			if tt.answer {
				// Parked again, it waits for the answer on the new worker. (A
				// timed-out request's turn goes on at once and its epoch may
				// be over before a poll sees its lease.)
				testutil.Eventually(t, 30*time.Second, func() bool {
					l, err := s.Store.LeaseLatest(ctx, gc)
					return err == nil && l.Value.RunID != first.Value.RunID
				}, "the sweep resumes the parked grandchild on the new worker")
				if _, err := s.Client.AnswerRequest(ctx, protocol.RequestAnswerRequest{RequestID: req.ID, Authority: s.Grant(), Answer: protocol.AnswerApprove}); err != nil {
					t.Fatalf("approve: %v", err)
				}
			}
			testutil.Eventually(t, 30*time.Second, func() bool {
				_, evs := s.Log(gc)
				_, ends := parkedEnds(evs)
				return len(ends) > 0
			}, "the continued turn ends")
			_, evs = s.Log(gc)
			trail, ends := parkedEnds(evs)
			if trail != "tool/call request/open request/answer tool/result" || strings.Join(ends, ",") != protocol.TurnCompleted {
				t.Fatalf("trail %s, turn ends %v; want one turn, continued and completed", trail, ends)
			}
			res := toolResults(evs, "run_command")
			if len(res) != 1 || !strings.Contains(protocol.PlainText(res[0].Content), tt.result) {
				t.Fatalf("run_command results %+v; want one with %q", res, tt.result)
			}
			got, err := os.ReadFile(filepath.Join(ws, "ran.txt"))
			if tt.ran && (err != nil || string(got) != "ran\n") || !tt.ran && err == nil {
				t.Fatalf("ran.txt = %q, %v; want the command run %v (once)", got, err, tt.ran)
			}
		})
	}
}

// parkedEnds returns a log's run_command call, request and result events
// in order, and its turn/end reasons; the log's turn/starts beyond one are
// counted as ends too (a second turn is no continuation).
func parkedEnds(evs []protocol.SessionEvent) (string, []string) {
	var trail, ends []string
	starts := 0
	for _, ev := range evs {
		switch ev.Type {
		case protocol.EvTurnStart:
			if starts++; starts > 1 {
				ends = append(ends, "second turn")
			}
		case protocol.EvTurnEnd:
			var d protocol.TurnEndData
			_ = ev.Decode(&d)
			ends = append(ends, d.Reason.Kind)
		case protocol.EvRequestOpen, protocol.EvRequestAnswer:
			trail = append(trail, ev.Type)
		case protocol.EvToolCall, protocol.EvToolResult:
			var d protocol.ToolCallData
			if ev.Decode(&d) == nil && d.Name == "run_command" {
				trail = append(trail, ev.Type)
			}
		}
	}
	return strings.Join(trail, " "), ends
}

// TestTheParkedSweepListsNoKeys: the parked sweep walks the request records
// its replica's watch of brood_agents holds; it creates no consumer (a key
// listing is one, created and deleted per replica every sweep, which a
// deployment pays for at its meta leader). A pending record past its
// deadline, written after the coordinator started, is timed out by a sweep
// all the same.
func TestTheParkedSweepListsNoKeys(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.ParkedSweepInterval = 50 * time.Millisecond })
	noConsumers := agentsConsumersCreated(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now()
	rec := protocol.RequestRecord{ID: ulid.Make().String(), SessionID: ulid.Make().String(), State: protocol.RequestPending,
		CreatedAt: now.Add(-time.Minute).UnixMilli(), Deadline: now.Add(-time.Second).UnixMilli()}
	if _, err := s.Store.CreateRequest(ctx, rec); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, func() bool {
		r, err := s.Store.Request(ctx, rec.ID)
		return err == nil && r.Value.State == protocol.RequestTimedOut
	}, "a sweep times out the request past its deadline")
	noConsumers()
}

// agentsConsumersCreated watches the advisories of consumers created on
// KV_brood_agents from now on; the function it returns fails t if any was
// (a sweep that lists the bucket's keys creates one per replica per sweep).
func agentsConsumersCreated(t *testing.T, s *stack.Stack) func() {
	t.Helper()
	nc := s.Conn()
	created, err := nc.SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.CREATED.KV_brood_agents.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if n, _, _ := created.Pending(); n != 0 {
			m, _ := created.NextMsg(0)
			t.Fatalf("%d consumers created on brood_agents while the sweep ran; the first: %s", n, m.Data)
		}
	}
}
