package coordinator_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// seen records the writes a store made, for a test to wait on one.
type seen struct {
	mu     sync.Mutex
	writes []store.Write
}

func (s *seen) wrap(f store.Faults) store.Faults {
	return store.Faults{
		Before: func(ctx context.Context, w store.Write) error {
			s.mu.Lock()
			s.writes = append(s.writes, w)
			s.mu.Unlock()
			return f.Before(ctx, w)
		},
		After: f.After,
	}
}

func (s *seen) has(match func(store.Write) bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.writes {
		if match(w) {
			return true
		}
	}
	return false
}

// TestSettlementTwoCoordinatorsSettleARunOnce: a worker pauses at its
// settlement; coordinator A takes the run over and pauses at its own
// settlement write; coordinator B judges A dead, takes the takeover over
// (the lease compare-and-set from A to B) and settles. When A comes back,
// and then the worker, their settlement compare-and-sets are refused: the
// run settles once, by B, with one notice and one subagent/end
// (DESIGN.md §7, Settlement 2; RELIABILITY.md I2).
func TestSettlementTwoCoordinatorsSettleARunOnce(t *testing.T) {
	s := stack.New(t)
	pauseA := testutil.NewPause(testutil.Settlement(s.Store))
	var aWrites seen
	var aNC *nats.Conn
	a := s.AddCoordinator(func(c *coordinator.Config) {
		aNC = c.NC
		c.Store = c.Store.WithFaults(aWrites.wrap(pauseA.Faults(c.Store)))
	})
	pauseW := testutil.NewPause(testutil.Settlement(s.Store))
	_, stopWorker := s.AddSpawnWorker(func(c *worker.InProcessConfig) {
		c.Store = c.Store.WithFaults(pauseW.Faults(c.Store))
	})
	t.Cleanup(pauseW.Release)
	t.Cleanup(pauseA.Release)
	root := s.Root()
	const notify = "test.notify.two-coordinators"
	got := testutil.Subscribe(t, s.NC, notify)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var reply protocol.RunStartReply
	if err := s.Client.Call(ctx, protocol.EpRunsStart, protocol.RunStartRequest{
		Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text("say finished"), Notify: notify,
	}, &reply); err != nil {
		t.Fatalf("runs.start: %v", err)
	}
	pauseW.WaitHeld(t, "the worker's settlement")
	pauseA.WaitHeld(t, "coordinator A's settlement")
	if pauseA.HeldWrite().Key != reply.RunID {
		t.Fatalf("A held a write to %s, want the run %s", pauseA.HeldWrite().Key, reply.RunID)
	}
	b := s.AddCoordinator()
	testutil.Eventually(t, 60*time.Second, func() bool {
		r, err := store.Get[protocol.RunRecord](ctx, s.Store.Runs, reply.RunID)
		return err == nil && r.Value.SettledBy == b.ID()
	}, "coordinator B settles the run A's takeover left")
	testutil.Eventually(t, 30*time.Second, func() bool { return len(got) == 1 }, "B's notice")

	pauseA.Release()
	// A's takeover ends by releasing the lease, after its settlement and
	// anything it would publish.
	testutil.Eventually(t, 60*time.Second, func() bool {
		return aWrites.has(func(w store.Write) bool {
			return w.Op == store.OpKVDelete && w.Bucket == s.Store.Agents.Bucket() && w.Key == reply.ChildID
		})
	}, "A finishes its takeover")
	pauseW.Release()
	stopWorker()
	for _, nc := range []*nats.Conn{aNC, s.NC} {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	for who, p := range map[string]*testutil.Pause{"coordinator A": pauseA, "the worker": pauseW} {
		answers := p.Answers()
		if len(answers) == 0 {
			t.Fatalf("%s never sent its settlement after its pause", who)
		}
		for _, err := range answers {
			if err == nil {
				t.Fatalf("%s's settlement landed over B's", who)
			}
		}
	}
	r, err := store.Get[protocol.RunRecord](ctx, s.Store.Runs, reply.RunID)
	if err != nil || r.Value.SettledBy != b.ID() || r.Value.SettledBy == a.ID() {
		t.Fatalf("run record %+v, %v; want it settled by B (%s)", r.Value, err, b.ID())
	}
	if n := len(got); n != 1 {
		t.Fatalf("%d notices, want exactly 1", n)
	}
	if n := s.Ends(root.SessionID, reply.RunID); n != 1 {
		t.Fatalf("%d subagent/end events, want 1", n)
	}
}

// TestTakeoverTwoCoordinatorsRacingForOneLease: a worker pauses at its
// settlement and both coordinators judge it dead; each is brought to its
// lease compare-and-set (the takeover's first step) and both are let go at
// once. Exactly one wins the lease; the session is fenced once and the run
// settled once (DESIGN.md §7, Settlement 2: every takeover step is a CAS).
func TestTakeoverTwoCoordinatorsRacingForOneLease(t *testing.T) {
	s := stack.New(t)
	agents := s.Store.Agents.Bucket()
	var child string
	var childMu sync.Mutex
	leaseWrite := func(w store.Write) bool {
		childMu.Lock()
		defer childMu.Unlock()
		return (w.Op == store.OpKVUpdate || w.Op == store.OpKVPut) && w.Bucket == agents && child != "" && w.Key == child
	}
	holds := []*testutil.Pause{testutil.NewHold(leaseWrite), testutil.NewHold(leaseWrite)}
	ids := make([]string, len(holds))
	for i, h := range holds {
		c := s.AddCoordinator(func(c *coordinator.Config) { c.Store = c.Store.WithFaults(h.Faults(c.Store)) })
		ids[i] = c.ID()
		t.Cleanup(h.Release)
	}
	pauseW := testutil.NewPause(testutil.Settlement(s.Store))
	_, stopWorker := s.AddSpawnWorker(func(c *worker.InProcessConfig) {
		c.Store = c.Store.WithFaults(pauseW.Faults(c.Store))
	})
	t.Cleanup(pauseW.Release)
	root := s.Root()
	const notify = "test.notify.lease-race"
	got := testutil.Subscribe(t, s.NC, notify)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var reply protocol.RunStartReply
	if err := s.Client.Call(ctx, protocol.EpRunsStart, protocol.RunStartRequest{
		Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text("say finished"), Notify: notify,
	}, &reply); err != nil {
		t.Fatalf("runs.start: %v", err)
	}
	childMu.Lock()
	child = reply.ChildID
	childMu.Unlock()
	pauseW.WaitHeld(t, "the worker's settlement")
	for i, h := range holds {
		h.WaitHeld(t, "coordinator "+ids[i]+"'s lease takeover")
	}
	for _, h := range holds {
		h.Release()
	}
	testutil.Eventually(t, 60*time.Second, func() bool {
		return len(holds[0].Answers()) > 0 && len(holds[1].Answers()) > 0
	}, "both lease writes answered")
	winners := 0
	for _, h := range holds {
		if h.Answers()[0] == nil {
			winners++
		}
	}
	if winners != 1 {
		t.Fatalf("%d coordinators won the lease, want exactly 1", winners)
	}
	testutil.Eventually(t, 60*time.Second, func() bool {
		r, err := store.Get[protocol.RunRecord](ctx, s.Store.Runs, reply.RunID)
		return err == nil && r.Value.State == protocol.RunSettled
	}, "the winner settles the run")
	testutil.Eventually(t, 30*time.Second, func() bool { return len(got) >= 1 }, "the notice")
	pauseW.Release()
	stopWorker()
	if err := s.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := len(got); n != 1 {
		t.Fatalf("%d notices, want exactly 1", n)
	}
	log, err := s.Store.ReadLog(ctx, "spawn", reply.ChildID)
	if err != nil {
		t.Fatal(err)
	}
	fences := 0
	for _, ev := range log.Events {
		if ev.Type == protocol.EvAgentTakeover {
			fences++
		}
	}
	if fences != 1 {
		t.Fatalf("%d agent/takeover records, want the winner's one", fences)
	}
}
