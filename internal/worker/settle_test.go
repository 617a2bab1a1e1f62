package worker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Contention tests of the settlement compare-and-set (docs/design.md §7,
// Settlement 1 and 2; RELIABILITY.md I2: a run settles exactly once). A
// worker is paused at its settlement write (testutil.Pause: the write is
// held and the worker's heartbeats fail), a coordinator takes the run or
// epoch over and settles it, and then the worker comes back and tries its
// own settlement: it must lose, and publish nothing.

// interruptedTurnEnds counts the turn/end events of evs that end a turn
// interrupted.
func interruptedTurnEnds(evs []protocol.SessionEvent) int {
	n := 0
	for _, ev := range evs {
		var d protocol.TurnEndData
		if ev.Type == protocol.EvTurnEnd && ev.Decode(&d) == nil && d.Reason.Kind == protocol.TurnInterrupted {
			n++
		}
	}
	return n
}

func runRecord(t *testing.T, st *store.Store, runID string) protocol.RunRecord {
	t.Helper()
	r, err := st.Run(context.Background(), runID)
	if err != nil {
		t.Fatalf("read run %s: %v", runID, err)
	}
	return r.Value
}

// TestSettlementAWorkerFinishingAfterATakeoverPublishesNothing: a one-shot
// run's turn ends, and its worker pauses before its settlement write. The
// coordinator judges it dead, takes the session over and settles the run
// with the result its log records. When the worker comes back, its
// settlement compare-and-set is refused: the run keeps the coordinator's
// settlement, and the caller gets exactly one notice and one subagent/end.
func TestSettlementAWorkerFinishingAfterATakeoverPublishesNothing(t *testing.T) {
	s := stack.New(t)
	coord := s.AddCoordinator()
	pause := testutil.NewPause(testutil.Settlement(s.Store))
	var workerNC *nats.Conn
	_, stopWorker := s.AddSpawnWorker(func(c *worker.InProcessConfig) {
		workerNC = c.NC
		c.Store = c.Store.WithFaults(pause.Faults(c.Store))
	})
	t.Cleanup(pause.Release)
	root := s.Root()
	const notify = "test.notify.settle-race"
	got := testutil.Subscribe(t, s.NC, notify)
	var reply protocol.RunStartReply
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Client.Call(ctx, protocol.EpRunsStart, protocol.RunStartRequest{
		Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text("say finished"), Notify: notify,
	}, &reply); err != nil {
		t.Fatalf("runs.start: %v", err)
	}
	pause.WaitHeld(t, "its settlement")
	testutil.Eventually(t, 60*time.Second, func() bool {
		return runRecord(t, s.Store, reply.RunID).SettledBy == coord.ID()
	}, "the coordinator settles the run of the paused worker")
	testutil.Eventually(t, 30*time.Second, func() bool { return len(got) == 1 }, "the coordinator's notice")
	taken := runRecord(t, s.Store, reply.RunID)

	pause.Release()
	stopWorker() // the worker sends its settlement, then drains
	if err := workerNC.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	answers := pause.Answers()
	if len(answers) == 0 {
		t.Fatal("the worker never sent its settlement after the pause")
	}
	for i, err := range answers {
		if err == nil {
			t.Fatalf("the worker's settlement write %d landed over the coordinator's", i+1)
		}
	}
	after := runRecord(t, s.Store, reply.RunID)
	if after.SettledBy != coord.ID() || after.SettledAt != taken.SettledAt {
		t.Fatalf("the run record changed after the takeover: settled by %s at %d, was %s at %d",
			after.SettledBy, after.SettledAt, taken.SettledBy, taken.SettledAt)
	}
	if n := len(got); n != 1 {
		t.Fatalf("%d notices, want exactly 1", n)
	}
	var notice protocol.RunNotice
	if err := protocol.Unmarshal(protocol.Msgpack, (<-got).Data, &notice); err != nil {
		t.Fatal(err)
	}
	if notice.RunID != reply.RunID || notice.Result.StopReason != after.Result.StopReason ||
		protocol.PlainText(notice.Result.Output) != "finished" {
		t.Fatalf("notice = %+v, want the settled result %+v", notice, *after.Result)
	}
	if n := s.Ends(root.SessionID, reply.RunID); n != 1 {
		t.Fatalf("%d subagent/end events, want 1", n)
	}
}

// TestSettlementAnEpochEndingAfterATakeoverPublishesNothing: a continuable
// child's epoch ends (its work is done) and its worker pauses before the
// epoch record's settlement. The coordinator takes the activation over and
// settles the epoch; when the worker comes back its compare-and-set is
// refused, the record keeps the coordinator's settlement, and the parent
// has exactly one settlement notice and one subagent/end.
func TestSettlementAnEpochEndingAfterATakeoverPublishesNothing(t *testing.T) {
	s := stack.New(t)
	coord := s.AddCoordinator()
	pause := testutil.NewPause(testutil.Settlement(s.Store))
	var workerNC *nats.Conn
	_, stopWorker := s.AddSpawnWorker(func(c *worker.InProcessConfig) {
		workerNC = c.NC
		c.Store = c.Store.WithFaults(pause.Faults(c.Store))
	})
	t.Cleanup(pause.Release)
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{
		Provider: "spawn", Parent: root.Ref(), Label: "epoch", Prompt: protocol.Text("say finished"),
	})
	if err != nil {
		t.Fatalf("continuable.start: %v", err)
	}
	pause.WaitHeld(t, "the settlement of its epoch")
	_, _, runID := store.RunsKindOf(pause.HeldWrite().Key)
	testutil.Eventually(t, 60*time.Second, func() bool {
		return runRecord(t, s.Store, runID).SettledBy == coord.ID()
	}, "the coordinator settles the epoch of the paused worker")
	taken := runRecord(t, s.Store, runID)

	pause.Release()
	stopWorker()
	if err := workerNC.Flush(); err != nil {
		t.Fatal(err)
	}
	answers := pause.Answers()
	if len(answers) == 0 {
		t.Fatal("the worker never sent the epoch's settlement after the pause")
	}
	for i, err := range answers {
		if err == nil {
			t.Fatalf("the worker's epoch settlement write %d landed over the coordinator's", i+1)
		}
	}
	after := runRecord(t, s.Store, runID)
	if after.SettledBy != coord.ID() || after.SettledAt != taken.SettledAt || after.ChildID != start.ChildID {
		t.Fatalf("the epoch record changed after the takeover: %+v, was %+v", after, taken)
	}
	items, err := testutil.InboxOf(t, s.Store, root.SessionID).Pending(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	settledNotices := 0
	for _, it := range items {
		if it.Source.Kind == protocol.SourceSubagentSettled && it.Source.SenderSessionID == start.ChildID {
			settledNotices++
		}
	}
	if settledNotices != 1 {
		t.Fatalf("%d settlement notices in the parent's inbox, want 1", settledNotices)
	}
	if n := s.Ends(root.SessionID, runID); n != 1 {
		t.Fatalf("%d subagent/end events for the epoch, want 1", n)
	}
}

// TestHostLostEndsAContinuableEpochWithHostLost: the worker of a continuable
// child stops mid-turn (paused at a log append, its heartbeats failing).
// The coordinator takes the activation over: the open turn is closed as
// interrupted, the epoch settles aborted with HOST_LOST (README; docs/design.md
// §7, Settlement 2), subagent/end says so, and the worker, back, is fenced
// out of the log and publishes nothing.
func TestHostLostEndsAContinuableEpochWithHostLost(t *testing.T) {
	s := stack.New(t)
	coord := s.AddCoordinator()
	var pause *testutil.Pause
	_, stopWorker := s.AddSpawnWorker(func(c *worker.InProcessConfig) {
		logs := c.Store.Subj.Log("spawn", "")
		pause = testutil.NewPause(func(w store.Write) bool {
			if w.Op != store.OpPublish || !strings.HasPrefix(w.Subject, logs) {
				return false
			}
			var rec protocol.LogRecord
			if protocol.Unmarshal(protocol.Msgpack, w.Msg.Data, &rec) != nil {
				return false
			}
			for _, ev := range rec.Events {
				if ev.Type == protocol.EvToolCall {
					return true // the turn's first step, logged after its opening
				}
			}
			return false
		})
		c.Store = c.Store.WithFaults(pause.Faults(c.Store))
	})
	t.Cleanup(pause.Release)
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{
		Provider: "spawn", Parent: root.Ref(), Label: "lost", Prompt: protocol.Text("call list_dir {}\nsay done"),
	})
	if err != nil {
		t.Fatalf("continuable.start: %v", err)
	}
	pause.WaitHeld(t, "the first step of its turn")
	var end protocol.LifecycleEvent
	testutil.Eventually(t, 60*time.Second, func() bool {
		for _, ev := range s.Lifecycle(root.SessionID) {
			if ev.Type == protocol.LifecycleEnd && ev.ID == start.ChildID {
				end = ev
				return true
			}
		}
		return false
	}, "the epoch of the lost host ends")
	if end.ErrorCode != protocol.CodeHostLost || end.StopReason != protocol.StopAborted {
		t.Fatalf("subagent/end %+v, want aborted with HOST_LOST", end)
	}
	rec := runRecord(t, s.Store, end.RunID)
	if rec.SettledBy != coord.ID() || rec.Result == nil || rec.Result.ErrorCode != protocol.CodeHostLost {
		t.Fatalf("epoch record %+v, want settled HOST_LOST by the coordinator", rec)
	}
	_, evs := s.Log(start.ChildID)
	if reasons := interruptedTurnEnds(evs); reasons != 1 {
		t.Fatalf("%d interrupted turn ends in the child's log, want the takeover's one", reasons)
	}
	pause.Release()
	stopWorker()
	_, after := s.Log(start.ChildID)
	for _, ev := range after[len(evs):] {
		if ev.Type == protocol.EvToolCall {
			t.Fatalf("the lost worker's held step landed after the takeover: %s", ev.Type)
		}
	}
	if n := s.Ends(root.SessionID, end.RunID); n != 1 {
		t.Fatalf("%d subagent/end events for the epoch, want 1", n)
	}
}
