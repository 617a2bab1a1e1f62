package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/client"
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

// pausedWorker adds a spawn worker whose store writes pass through p,
// released when the test ends.
func pausedWorker(t *testing.T, s *stack.Stack, p *testutil.Pause) (*worker.Host, func()) {
	w, stop := s.AddSpawnWorker(func(c *worker.InProcessConfig) { c.Store = c.Store.WithFaults(p.Faults(c.Store)) })
	t.Cleanup(p.Release)
	return w, stop
}

// startWithNotices starts a one-shot run of root on spawn that runs prompt,
// its notices published on test.notify.<tag>, and returns the start's
// reply and those notices.
func startWithNotices(t *testing.T, s *stack.Stack, root *client.Root, tag, prompt string) (protocol.RunStartReply, chan *nats.Msg) {
	t.Helper()
	notify := "test.notify." + tag
	got := testutil.Subscribe(t, s.NC, notify)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var reply protocol.RunStartReply
	if err := s.Client.Call(ctx, protocol.EpRunsStart, protocol.RunStartRequest{
		Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text(prompt), Notify: notify,
	}, &reply); err != nil {
		t.Fatalf("runs.start: %v", err)
	}
	return reply, got
}

// fences counts the agent/takeover records of a session's log.
func fences(evs []protocol.SessionEvent) int {
	n := 0
	for _, ev := range evs {
		if ev.Type == protocol.EvAgentTakeover {
			n++
		}
	}
	return n
}

// wantOneNotice fails the test unless exactly one notice came by the time
// everything sent before reached the server (a flush).
func wantOneNotice(t *testing.T, s *stack.Stack, got chan *nats.Msg) {
	t.Helper()
	if err := s.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := len(got); n != 1 {
		t.Fatalf("%d notices, want exactly 1", n)
	}
}

// TestSettlementTwoCoordinatorsSettleARunOnce: a worker pauses at its
// settlement; coordinator A takes the run over and pauses at its own
// settlement write; coordinator B judges A dead, takes the takeover over
// (the lease compare-and-set from A to B) and settles. When A comes back,
// and then the worker, their settlement compare-and-sets are refused: the
// run settles once, by B, with one notice and one subagent/end, and with
// the result its log records (the turn had ended: completed, not HOST_LOST)
// (docs/design.md §7, Settlement 2; RELIABILITY.md I2).
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
	_, stopWorker := pausedWorker(t, s, pauseW)
	t.Cleanup(pauseA.Release)
	root := s.Root()
	reply, got := startWithNotices(t, s, root, "two-coordinators", "say finished")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pauseW.WaitHeld(t, "the worker's settlement")
	pauseA.WaitHeld(t, "coordinator A's settlement")
	if pauseA.HeldWrite().Key != store.RunStateKey("spawn", reply.RunID) {
		t.Fatalf("A held a write to %s, want the state of the run %s", pauseA.HeldWrite().Key, reply.RunID)
	}
	b := s.AddCoordinator()
	testutil.Eventually(t, 60*time.Second, func() bool {
		r, err := s.Store.Run(ctx, reply.RunID)
		return err == nil && r.Value.SettledBy == b.ID()
	}, "coordinator B settles the run A's takeover left")
	testutil.Eventually(t, 30*time.Second, func() bool { return len(got) == 1 }, "B's notice")

	pauseA.Release()
	// A's takeover ends by releasing the lease, after its settlement and
	// anything it would publish.
	testutil.Eventually(t, 60*time.Second, func() bool {
		return aWrites.has(func(w store.Write) bool {
			return w.Op == store.OpKVDelete && w.Bucket == s.Store.Agents.Bucket() && w.Key == store.LeaseKey("spawn", reply.ChildID)
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
	r, err := s.Store.Run(ctx, reply.RunID)
	if err != nil || r.Value.SettledBy != b.ID() || r.Value.SettledBy == a.ID() {
		t.Fatalf("run record %+v, %v; want it settled by B (%s)", r.Value, err, b.ID())
	}
	// The worker's turn had ended before its host was lost: the takeover
	// settles the run with the result its log records, not HOST_LOST.
	if res := r.Value.Result; res == nil || res.StopReason != protocol.StopCompleted || res.ErrorCode != "" || protocol.PlainText(res.Output) != "finished" {
		t.Fatalf("result %+v; want the completed turn's, as the log records it", res)
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
// settled once, by the winner (docs/design.md §7, Settlement 2: every takeover
// step is a CAS), and the takeover is counted once, by the winner, in the
// sweep that won the lease (brood_takeovers_total: the loser counts none).
func TestTakeoverTwoCoordinatorsRacingForOneLease(t *testing.T) {
	s := stack.New(t)
	agents := s.Store.Agents.Bucket()
	var child string
	var childMu sync.Mutex
	leaseWrite := func(w store.Write) bool {
		childMu.Lock()
		defer childMu.Unlock()
		return (w.Op == store.OpKVUpdate || w.Op == store.OpKVPut) && w.Bucket == agents && child != "" && w.Key == store.LeaseKey("spawn", child)
	}
	holds := []*testutil.Pause{testutil.NewHold(leaseWrite), testutil.NewHold(leaseWrite)}
	ids := make([]string, len(holds))
	metrics := make([]*telemetry.Metrics, len(holds))
	for i, h := range holds {
		metrics[i] = telemetry.NewMetrics("test")
		c := s.AddCoordinator(func(c *coordinator.Config) {
			c.Store, c.Metrics = c.Store.WithFaults(h.Faults(c.Store)), metrics[i]
		})
		ids[i] = c.ID()
		t.Cleanup(h.Release)
	}
	pauseW := testutil.NewPause(testutil.Settlement(s.Store))
	_, stopWorker := pausedWorker(t, s, pauseW)
	root := s.Root()
	reply, got := startWithNotices(t, s, root, "lease-race", "say finished")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
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
	winner := ids[0]
	if holds[0].Answers()[0] != nil {
		winner = ids[1]
	}
	testutil.Eventually(t, 60*time.Second, func() bool {
		r, err := s.Store.Run(ctx, reply.RunID)
		return err == nil && r.Value.State == protocol.RunSettled
	}, "the winner settles the run")
	if r, err := s.Store.Run(ctx, reply.RunID); err != nil || r.Value.SettledBy != winner {
		t.Fatalf("run record %+v (%v); want it settled by the lease's winner %s, the loser goes no further", r.Value, err, winner)
	}
	for i, m := range metrics {
		f, err := m.Gather()
		if err != nil {
			t.Fatal(err)
		}
		want := 0.0
		if ids[i] == winner {
			want = 1
		}
		if n, _ := f.Sum("brood_takeovers_total", "mode", protocol.ModeOneShot); n != want {
			t.Errorf("coordinator %s (winner %s) counted %v takeovers, want %v", ids[i], winner, n, want)
		}
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return len(got) >= 1 }, "the notice")
	pauseW.Release()
	stopWorker()
	wantOneNotice(t, s, got)
	if _, evs := s.Log(reply.ChildID); fences(evs) != 1 {
		t.Fatalf("%d agent/takeover records, want the winner's one", fences(evs))
	}
}

// TestTakeoverPublishesTheEndOfARunItsHostSettled: a worker settles its run
// and stops heartbeating before its subagent/end is sent (paused at that
// publish). The coordinator that takes the session over finds the run
// settled: it publishes the start again and the end with the worker's
// result, then releases the lease, and settles nothing again (the record
// keeps the worker's settlement). Once the worker comes back, its own end
// is the same message (deduplicated): one subagent/end in all (docs/design.md
// §7, Settlement 2; RELIABILITY.md I7).
func TestTakeoverPublishesTheEndOfARunItsHostSettled(t *testing.T) {
	s := stack.New(t)
	co := s.AddCoordinator()
	root := s.Root()
	endSubject := s.Store.Subj.Events("spawn", root.SessionID, protocol.EventKindEnd)
	pauseW := testutil.NewPause(func(w store.Write) bool { return w.Op == store.OpPublish && w.Subject == endSubject })
	w, stopWorker := pausedWorker(t, s, pauseW)
	reply, got := startWithNotices(t, s, root, "settled-then-lost", "say settled")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pauseW.WaitHeld(t, "the worker's subagent/end")
	testutil.Eventually(t, 60*time.Second, func() bool {
		_, err := store.GetLatest[protocol.AgentRecord](ctx, s.Store.Agents, store.LeaseKey("spawn", reply.ChildID))
		return errors.Is(err, store.ErrNotFound) && s.Ends(root.SessionID, reply.RunID) == 1
	}, "the coordinator publishes the run's end and releases its lease")
	testutil.Eventually(t, 30*time.Second, func() bool { return len(got) > 0 }, "the notice")
	r, err := s.Store.Run(ctx, reply.RunID)
	if err != nil || r.Value.SettledBy != w.ID() || r.Value.Result == nil || r.Value.Result.StopReason != protocol.StopCompleted {
		t.Fatalf("run record %+v (%v); want the worker %s's completed settlement", r.Value, err, w.ID())
	}
	if r.Value.SettledBy == co.ID() {
		t.Fatal("the coordinator settled a run its host had settled")
	}
	pauseW.Release()
	stopWorker()
	if n := s.Ends(root.SessionID, reply.RunID); n != 1 {
		t.Fatalf("%d subagent/end events, want 1", n)
	}
	var notice protocol.RunNotice
	if err := protocol.Unmarshal(protocol.Msgpack, (<-got).Data, &notice); err != nil || notice.Result.StopReason != protocol.StopCompleted {
		t.Fatalf("notice %+v (%v), want the worker's completed result", notice, err)
	}
}

// TestALiveHostsRunIsNeverTakenOver: a run that lasts three host expiries
// on a worker that keeps heartbeating is left to it: it completes with its
// own result, settled by its worker, and no coordinator writes a takeover
// into its log (docs/design.md §4, Liveness: a host is dead only once it stopped
// heartbeating for the expiry).
func TestALiveHostsRunIsNeverTakenOver(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddCoordinator()
	w, _ := s.AddSpawnWorker()
	root := s.Root()
	run, res, err := s.Run(root.Ref(), "spawn", fmt.Sprintf("sleep %s\nsay done", 3*stack.HostExpiry), protocol.StartOptions{})
	if err != nil || res.StopReason != protocol.StopCompleted || res.ErrorCode != "" {
		t.Fatalf("run: %+v, %v; want it completed", res, err)
	}
	r, err := s.Store.Run(context.Background(), run.RunID)
	if err != nil || r.Value.SettledBy != w.ID() {
		t.Fatalf("run record %+v (%v), want it settled by its worker %s", r.Value, err, w.ID())
	}
	if _, evs := s.Log(run.ChildID); fences(evs) != 0 {
		t.Fatalf("a takeover was written into the log of a live host's run: %+v", evs)
	}
}

// TestATakeoverResumedAfterAFailedSettlementFencesOnce: a coordinator takes
// a dead worker's run over, fences its log, and its settlement write fails;
// the lease stays taken over, so its next sweep resumes the takeover, finds
// its own fence last in the log and writes nothing more there, then
// settles: one agent/takeover, one settlement (by it), one subagent/end
// and one notice (docs/design.md §7, Settlement 2).
func TestATakeoverResumedAfterAFailedSettlementFencesOnce(t *testing.T) {
	s := stack.New(t)
	refused := errors.New("test: the coordinator's first settlement write fails")
	var failed atomic.Bool
	settlement := testutil.Settlement(s.Store)
	co := s.AddCoordinator(func(c *coordinator.Config) {
		c.Store = c.Store.WithFaults(store.Faults{
			Before: func(_ context.Context, w store.Write) error {
				if settlement(w) && failed.CompareAndSwap(false, true) {
					return refused
				}
				return nil
			},
			After: func(_ context.Context, _ store.Write, err error) error { return err },
		})
	})
	pauseW := testutil.NewPause(testutil.Settlement(s.Store))
	_, stopWorker := pausedWorker(t, s, pauseW)
	root := s.Root()
	reply, got := startWithNotices(t, s, root, "resumed-takeover", "say finished")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pauseW.WaitHeld(t, "the worker's settlement")
	testutil.Eventually(t, 60*time.Second, func() bool {
		r, err := s.Store.Run(ctx, reply.RunID)
		return err == nil && r.Value.State == protocol.RunSettled && s.Ends(root.SessionID, reply.RunID) == 1
	}, "the coordinator settles the run on its resumed takeover")
	if !failed.Load() {
		t.Fatal("the coordinator's first settlement write was never tried")
	}
	pauseW.Release()
	stopWorker()
	r, err := s.Store.Run(ctx, reply.RunID)
	if err != nil || r.Value.SettledBy != co.ID() {
		t.Fatalf("run record %+v (%v); want it settled by the coordinator %s", r.Value, err, co.ID())
	}
	if _, evs := s.Log(reply.ChildID); fences(evs) != 1 {
		t.Fatalf("%d agent/takeover records, want 1 (the resumed takeover writes none)", fences(evs))
	}
	wantOneNotice(t, s, got)
}

// TestARunWhoseHostDiesMidTurnEndsHostLost: a worker stops heartbeating in
// the middle of a run's turn (its heartbeat held from then on). The
// coordinator takes the run over: no instance is live to continue it, so
// after ContinueWaitMax the open turn is closed as interrupted (cause
// HOST_LOST) with no other record after it, and the run settles once,
// by the coordinator, error HOST_LOST, with one notice and one subagent/end
// (docs/design.md §7, Settlement 2; docs/upstream-behaviour.md: a lost host's run ends
// HOST_LOST).
func TestARunWhoseHostDiesMidTurnEndsHostLost(t *testing.T) {
	s := stack.New(t)
	co := s.AddCoordinator()
	var armed atomic.Bool
	hosts := s.Store.Hosts.Bucket()
	pauseW := testutil.NewPause(func(w store.Write) bool { return armed.Load() && w.Op == store.OpKVPut && w.Bucket == hosts })
	_, stopWorker := pausedWorker(t, s, pauseW)
	root := s.Root()
	reply, got := startWithNotices(t, s, root, "mid-turn", "sleep 60s\nsay late")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, evs := s.Log(reply.ChildID)
		open := false
		for _, ev := range evs {
			open = (open || ev.Type == protocol.EvTurnStart) && ev.Type != protocol.EvTurnEnd
		}
		return open
	}, "the turn is open")
	armed.Store(true)
	pauseW.WaitHeld(t, "the worker's next heartbeat")
	testutil.Eventually(t, 60*time.Second, func() bool {
		r, err := s.Store.Run(ctx, reply.RunID)
		return err == nil && r.Value.State == protocol.RunSettled && s.Ends(root.SessionID, reply.RunID) == 1 && len(got) > 0
	}, "the coordinator settles the run, with its end and notice")
	r, err := s.Store.Run(ctx, reply.RunID)
	if err != nil || r.Value.SettledBy != co.ID() || r.Value.Result == nil ||
		r.Value.Result.StopReason != protocol.StopError || r.Value.Result.ErrorCode != protocol.CodeHostLost {
		t.Fatalf("run record %+v (%v); want it settled error HOST_LOST by the coordinator", r.Value, err)
	}
	_, evs := s.Log(reply.ChildID)
	var end protocol.TurnEndData
	last := evs[len(evs)-1]
	if last.Type != protocol.EvTurnEnd || last.Decode(&end) != nil || end.Reason.Kind != protocol.TurnInterrupted || end.Reason.Cause != protocol.CauseHostLost {
		t.Fatalf("the log ends with %s %+v, want the turn closed as interrupted (host lost)", last.Type, end)
	}
	// The takeover fenced the log first, leaving the turn open for an
	// instance to continue (none was live: the only worker is the one that
	// stopped heartbeating), and closed it once ContinueWaitMax passed:
	// one agent/takeover, right before the turn's end.
	if fences(evs) != 1 || evs[len(evs)-2].Type != protocol.EvAgentTakeover {
		t.Fatalf("want one agent/takeover, right before the closed turn's end: %+v", evs)
	}
	if r.Value.Takeovers != 1 {
		t.Errorf("run record counts %d takeovers; want 1: %+v", r.Value.Takeovers, r.Value)
	}
	pauseW.Release()
	stopWorker()
	wantOneNotice(t, s, got)
}

// TestADeadHostsRunWithAnEmptyLogIsFencedAndSettled: a one-shot run whose
// host took the session's lease and died before its first append (its own
// events none, no subagent/start published) is taken over like any other:
// the log gets one agent/takeover (so the lost host's first append is
// refused), the run settles once, by the coordinator, error/HOST_LOST (a
// dead host's run ends HOST_LOST: docs/design.md §7, Settlement 2; the log
// records no result of its own, and a seeded child's seed, its parent's
// turns, is not its result), its start and end are published once each,
// and the lease goes. Before, such a run settled error "the child never
// finished a turn" with no code, and a seeded one with its seed's last turn.
func TestADeadHostsRunWithAnEmptyLogIsFencedAndSettled(t *testing.T) {
	s := stack.New(t)
	co := s.AddCoordinator()
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var seed []protocol.SessionEvent
	for _, e := range []struct {
		typ  string
		data any
	}{
		{protocol.EvTurnStart, protocol.TurnData{Turn: 1}},
		{protocol.EvStepStart, protocol.StepData{Turn: 1, Step: 1}},
		{protocol.EvTurnEnd, protocol.TurnEndData{Turn: 1, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}}},
	} {
		ev, err := protocol.NewEvent(e.typ, store.NowMs(), e.data)
		if err != nil {
			t.Fatal(err)
		}
		seed = append(seed, ev)
	}
	for i, seed := range [][]protocol.SessionEvent{nil, seed} {
		name := map[bool]string{true: "an empty log", false: "a seeded child's seed only"}[seed == nil]
		t.Run(name, func(t *testing.T) {
			child, runID := fmt.Sprintf("empty-log-of-a-dead-host-%d", i), fmt.Sprintf("run-of-a-dead-host-%d", i)
			now := store.NowMs()
			if err := s.Store.PutHeader(ctx, protocol.SessionHeader{Version: protocol.SessionHeaderVersion, ID: child, CreatedAt: now,
				ParentSession: root.SessionID, Origin: protocol.OriginSubagent, DelegationDepth: 1, Provider: "spawn",
				SeedLength: int64(len(seed))}); err != nil {
				t.Fatal(err)
			}
			if len(seed) > 0 {
				if _, err := s.Store.NewLogWriter("spawn", child, 0, 0).Append(ctx, seed...); err != nil {
					t.Fatal(err)
				}
			}
			testutil.PutRun(t, s.Store, protocol.RunRecord{RunID: runID, ChildID: child, ParentSession: root.SessionID,
				Provider: "spawn", Mode: protocol.ModeOneShot, State: protocol.RunRunning, CreatedAt: now, StartedAt: now, HostID: "host-that-died"})
			if _, err := store.Create(ctx, s.Store.Agents, store.LeaseKey("spawn", child), protocol.AgentRecord{SessionID: child, Kind: protocol.AgentOneShot,
				HostID: "host-that-died", Epoch: 1, RunID: runID, Provider: "spawn", CredentialHash: protocol.HashCredential(protocol.NewCredential()),
				ParentSession: root.SessionID, Ancestry: []string{root.SessionID}, CreatedAt: now}); err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, 30*time.Second, func() bool {
				r, err := s.Store.Run(ctx, runID)
				_, leaseErr := store.GetLatest[protocol.AgentRecord](ctx, s.Store.Agents, store.LeaseKey("spawn", child))
				return err == nil && r.Value.State == protocol.RunSettled && errors.Is(leaseErr, store.ErrNotFound) && s.Ends(root.SessionID, runID) == 1
			}, "the coordinator settles the run, publishes its end and releases its lease")
			r, err := s.Store.Run(ctx, runID)
			if err != nil || r.Value.SettledBy != co.ID() || r.Value.Result == nil || r.Value.Result.StopReason != protocol.StopError ||
				r.Value.Result.ErrorCode != protocol.CodeHostLost {
				t.Fatalf("run record %+v (result %+v, %v); want it settled error/HOST_LOST by the coordinator %s", r.Value, r.Value.Result, err, co.ID())
			}
			if _, evs := s.Log(child); len(evs) != len(seed)+1 || fences(evs) != 1 || evs[len(evs)-1].Type != protocol.EvAgentTakeover {
				t.Fatalf("log %+v; want the seed and the takeover's one agent/takeover", evs)
			}
			starts := 0
			for _, ev := range s.Lifecycle(root.SessionID) {
				if ev.Type == protocol.LifecycleStart && ev.RunID == runID {
					starts++
				}
			}
			if starts != 1 {
				t.Fatalf("%d subagent/start events, want the one the takeover published", starts)
			}
		})
	}
}

// TestARunPastTakeoversMaxEndsHostLost (issue 31, item 2): a one-shot
// run's host stops heartbeating mid-turn and the run is continued on the
// other live worker (one takeover, the lease that worker's, the turn still
// open); that worker stops heartbeating too while a third is live, and the
// run, past TakeoversMax (1), ends HOST_LOST at that takeover, without the
// wait for an instance (ContinueWaitMax, 30 s here), settled once by the
// coordinator with two takeovers counted.
func TestARunPastTakeoversMaxEndsHostLost(t *testing.T) {
	s := stack.New(t)
	co := s.AddCoordinator(func(c *coordinator.Config) { c.TakeoversMax, c.ContinueWaitMax = 1, 30*time.Second })
	hosts := s.Store.Hosts.Bucket()
	pausable := func() (*worker.Host, *testutil.Pause, *atomic.Bool) {
		armed := new(atomic.Bool)
		p := testutil.NewPause(func(w store.Write) bool { return armed.Load() && w.Op == store.OpKVPut && w.Bucket == hosts })
		w, stop := pausedWorker(t, s, p)
		t.Cleanup(func() { p.Release(); stop() })
		return w, p, armed
	}
	_, pauseA, armedA := pausable()
	s.WaitProvider("spawn")
	root := s.Root()
	reply, got := startWithNotices(t, s, root, "takeovers-max", "sleep 60s\nsay late")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, evs := s.Log(reply.ChildID)
		return len(evs) > 0 && evs[len(evs)-1].Type == protocol.EvSubagentDescriptor
	}, "the turn is open")
	b, pauseB, armedB := pausable()
	armedA.Store(true)
	pauseA.WaitHeld(t, "the first worker's next heartbeat")
	testutil.Eventually(t, 20*time.Second, func() bool {
		l, err := s.Store.LeaseLatest(ctx, reply.ChildID)
		return err == nil && l.Value.HostID == b.ID() && l.Value.TakenOverBy == ""
	}, "the run continued on the second worker")
	pausable() // a third, live
	armedB.Store(true)
	pauseB.WaitHeld(t, "the second worker's next heartbeat")
	lost := time.Now()
	testutil.Eventually(t, 20*time.Second, func() bool {
		r, err := s.Store.Run(ctx, reply.RunID)
		return err == nil && r.Value.State == protocol.RunSettled && len(got) > 0
	}, "the run settled")
	if d := time.Since(lost); d > 15*time.Second {
		t.Errorf("settled %s after the second loss: it waited for an instance, past TakeoversMax", d)
	}
	r, err := s.Store.Run(ctx, reply.RunID)
	if err != nil || r.Value.SettledBy != co.ID() || r.Value.Result.ErrorCode != protocol.CodeHostLost ||
		!strings.Contains(r.Value.Result.Diagnostic, "(TakeoversMax, brood coordinator --takeovers-max)") || r.Value.Takeovers != 2 {
		t.Fatalf("run record %+v (result %+v), %v; want HOST_LOST by the coordinator after 2 takeovers, naming TakeoversMax and its flag", r.Value, r.Value.Result, err)
	}
	_, evs := s.Log(reply.ChildID)
	if fences(evs) != 2 || countType(evs, protocol.EvTurnEnd) != 1 {
		t.Fatalf("want two agent/takeover records and one turn end: %+v", evs)
	}
	wantOneNotice(t, s, got)
}

func countType(evs []protocol.SessionEvent, typ string) int {
	n := 0
	for _, ev := range evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}
