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

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// Tests of the takeover of a continuable child's epoch (takeOverActivation)
// and of orphaned run records (orphans, orphanDue, settleOrphan), in the
// package: each writes what a host that died left behind (a header, a log,
// a run or epoch record, a lease held by a host never seen heartbeating)
// and checks what the coordinator makes of it.

const deadHost = "host-that-died"

// putChild writes the header of a spawn child of root, and events as the
// head of its log.
func putChild(t *testing.T, s *stack.Stack, root *client.Root, child string, events ...protocol.SessionEvent) {
	t.Helper()
	putChildOf(t, s, root, "spawn", child, events...)
}

// putChildOf writes the header of a child of root of provider, and events
// as the head of its log (in provider's scope).
func putChildOf(t *testing.T, s *stack.Stack, root *client.Root, provider, child string, events ...protocol.SessionEvent) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Store.PutHeader(ctx, protocol.SessionHeader{Version: protocol.SessionHeaderVersion, ID: child, CreatedAt: store.NowMs(),
		ParentSession: root.SessionID, Origin: protocol.OriginSubagent, DelegationDepth: 1, Provider: provider}); err != nil {
		t.Fatal(err)
	}
	if len(events) > 0 {
		if _, err := s.Store.NewLogWriter(provider, child, 0, 0).Append(ctx, events...); err != nil {
			t.Fatal(err)
		}
	}
}

// putRun writes rec as a new run or epoch record (its spec and its state).
func putRun(t *testing.T, s *stack.Stack, rec protocol.RunRecord) {
	t.Helper()
	testutil.PutRun(t, s.Store, rec)
}

// runOf reads a run or epoch record.
func runOf(s *stack.Stack, runID string) (protocol.RunRecord, error) {
	r, err := s.Store.Run(context.Background(), runID)
	return r.Value, err
}

// putLease writes rec as the lease of its session.
func putLease(t *testing.T, s *stack.Stack, rec protocol.AgentRecord) {
	t.Helper()
	if _, err := store.Create(context.Background(), s.Store.Agents, store.LeaseKey(rec.Provider, rec.SessionID), rec); err != nil {
		t.Fatal(err)
	}
}

// leaseHeld reports whether the lease of spawn child id exists (read from
// the leader).
func leaseHeld(t *testing.T, s *stack.Stack, id string) bool {
	t.Helper()
	_, err := store.GetLatest[protocol.AgentRecord](context.Background(), s.Store.Agents, store.LeaseKey("spawn", id))
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

// deadLease is the lease of a child of root held by a host that never
// heartbeated.
func deadLease(root *client.Root, child, runID, kind string, epochStart int64) protocol.AgentRecord {
	return protocol.AgentRecord{SessionID: child, Kind: kind, HostID: deadHost, Epoch: 1, RunID: runID, Provider: "spawn",
		CredentialHash: protocol.HashCredential(protocol.NewCredential()), ParentSession: root.SessionID,
		Ancestry: []string{root.SessionID}, CreatedAt: store.NowMs(), EpochStart: epochStart}
}

func event(t *testing.T, typ string, data any) protocol.SessionEvent {
	t.Helper()
	ev, err := protocol.NewEvent(typ, store.NowMs(), data)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func descriptorEvent(t *testing.T) protocol.SessionEvent {
	return event(t, protocol.EvSubagentDescriptor, continuableDescriptor())
}

func continuableDescriptor() protocol.DescriptorData {
	return protocol.DescriptorData{Version: protocol.DescriptorVersion, Mode: protocol.ModeContinuable, Provider: "spawn", Label: "worker"}
}

// settledNotices counts the subagent-settled notices from child in the
// inbox of parent.
func settledNotices(t *testing.T, s *stack.Stack, parent, child string) int {
	t.Helper()
	items, err := testutil.InboxOf(t, s.Store, parent).Pending(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, it := range items {
		if it.Source.Kind == protocol.SourceSubagentSettled && it.Source.SenderSessionID == child {
			n++
		}
	}
	return n
}

// lastTurnEnd returns the reason of the last turn/end of evs.
func lastTurnEnd(evs []protocol.SessionEvent) (protocol.TurnEndReason, bool) {
	for i := len(evs) - 1; i >= 0; i-- {
		var d protocol.TurnEndData
		if evs[i].Type == protocol.EvTurnEnd && evs[i].Decode(&d) == nil {
			return d.Reason, true
		}
	}
	return protocol.TurnEndReason{}, false
}

// TestTakeoverOfADeadHostsEpoch: the lease of a continuable child whose host
// stopped heartbeating is taken over and the epoch ends as docs/design.md §7
// (Settlement 2) and docs/protocol.md §9.8 say: a turn in flight is closed
// as interrupted and the epoch settles aborted with HOST_LOST; an epoch
// whose host died before it began a turn settles completed, whatever an
// earlier epoch's turns ended with (its result is the epoch's own events',
// from the lease's epochStart); an epoch its host settled before dying is
// published with the host's result, not settled again; one settled never
// started, or one with no record, publishes no end. Each settled epoch
// gives its parent one subagent-settled notice and one subagent/end, and
// the lease goes only after them; the log is fenced so the lost host's
// next append is refused.
func TestTakeoverOfADeadHostsEpoch(t *testing.T) {
	s := stack.New(t)
	co := s.AddCoordinator()
	root := s.Root()
	turnStart := func(turn int64) protocol.SessionEvent {
		return event(t, protocol.EvTurnStart, protocol.TurnData{Turn: turn})
	}
	stepStart := func(turn int64) protocol.SessionEvent {
		return event(t, protocol.EvStepStart, protocol.StepData{Turn: turn, Step: 1})
	}
	turnEnd := func(turn int64, r protocol.TurnEndReason) protocol.SessionEvent {
		return event(t, protocol.EvTurnEnd, protocol.TurnEndData{Turn: turn, Reason: r})
	}
	completed := protocol.SubagentResult{Output: protocol.Text("done"), StopReason: protocol.StopCompleted}
	tests := []struct {
		name       string
		log        []protocol.SessionEvent
		epochStart int64
		record     string // the epoch record's state: running, settled, "" none
		notStarted bool
		settledBy  string // who the record names as its settler afterwards ("" the coordinator)
		want       protocol.SubagentResult
		lastEvent  string // the type of the log's last event afterwards
		published  bool   // a subagent/end and a notice
	}{
		{
			name: "mid-turn", log: []protocol.SessionEvent{descriptorEvent(t), turnStart(1), stepStart(1)}, record: protocol.RunRunning,
			want:      protocol.SubagentResult{StopReason: protocol.StopAborted, ErrorCode: protocol.CodeHostLost},
			lastEvent: protocol.EvTurnEnd, published: true,
		},
		{
			name: "before its first turn, after an earlier epoch's failed turn",
			log: []protocol.SessionEvent{descriptorEvent(t), turnStart(1), stepStart(1),
				turnEnd(1, protocol.TurnEndReason{Kind: protocol.TurnError, Error: "the model failed"})},
			epochStart: 4, record: protocol.RunRunning,
			want:      protocol.SubagentResult{StopReason: protocol.StopCompleted},
			lastEvent: protocol.EvAgentTakeover, published: true,
		},
		{
			name: "settled by its host, which died before publishing",
			log: []protocol.SessionEvent{descriptorEvent(t), turnStart(1), stepStart(1),
				turnEnd(1, protocol.TurnEndReason{Kind: protocol.TurnCompleted})},
			record: protocol.RunSettled, settledBy: deadHost, want: completed,
			lastEvent: protocol.EvAgentTakeover, published: true,
		},
		{
			name: "settled never started", log: []protocol.SessionEvent{descriptorEvent(t)},
			record: protocol.RunSettled, notStarted: true, settledBy: deadHost,
			want:      protocol.SubagentResult{StopReason: protocol.StopError, ErrorCode: protocol.CodeUnavailable},
			lastEvent: protocol.EvAgentTakeover,
		},
		{
			name: "no epoch record", log: []protocol.SessionEvent{descriptorEvent(t)},
			lastEvent: protocol.EvAgentTakeover,
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			child, runID := fmt.Sprintf("epoch-of-a-dead-host-%d", i), fmt.Sprintf("epoch-run-of-a-dead-host-%d", i)
			putChild(t, s, root, child, tt.log...)
			now := store.NowMs()
			if tt.record != "" {
				rec := protocol.RunRecord{RunID: runID, ChildID: child, ParentSession: root.SessionID, Provider: "spawn",
					Mode: protocol.ModeContinuable, State: tt.record, CreatedAt: now, StartedAt: now, HostID: deadHost}
				if tt.record == protocol.RunSettled {
					res := tt.want
					rec.Result, rec.SettledAt, rec.SettledBy, rec.NotStarted = &res, now, deadHost, tt.notStarted
				}
				putRun(t, s, rec)
			}
			putLease(t, s, deadLease(root, child, runID, protocol.AgentContinuable, tt.epochStart))
			testutil.Eventually(t, 30*time.Second, func() bool { return !leaseHeld(t, s, child) }, "the takeover releases the lease")

			// The end and the notice are published before the lease goes.
			ends := s.Ends(root.SessionID, runID)
			notices := settledNotices(t, s, root.SessionID, child)
			if want := map[bool]int{true: 1, false: 0}[tt.published]; ends != want || notices != want {
				t.Fatalf("%d subagent/end and %d notices before the lease went, want %d of each", ends, notices, want)
			}
			if tt.record != "" {
				r, err := runOf(s, runID)
				settledBy := tt.settledBy
				if settledBy == "" {
					settledBy = co.ID()
				}
				if err != nil || r.State != protocol.RunSettled || r.SettledBy != settledBy || r.Result == nil ||
					r.Result.StopReason != tt.want.StopReason || r.Result.ErrorCode != tt.want.ErrorCode {
					t.Fatalf("epoch record %+v (result %+v, %v); want it settled by %s with %s/%s",
						r, r.Result, err, settledBy, tt.want.StopReason, tt.want.ErrorCode)
				}
			}
			if tt.published {
				var end protocol.LifecycleEvent
				for _, ev := range s.Lifecycle(root.SessionID) {
					if ev.Type == protocol.LifecycleEnd && ev.RunID == runID {
						end = ev
					}
				}
				if end.StopReason != tt.want.StopReason || end.ErrorCode != tt.want.ErrorCode {
					t.Fatalf("subagent/end %+v, want %s/%s", end, tt.want.StopReason, tt.want.ErrorCode)
				}
			}
			_, evs := s.Log(child)
			if last := evs[len(evs)-1]; last.Type != tt.lastEvent {
				t.Fatalf("the log ends with %s, want %s: %+v", last.Type, tt.lastEvent, evs)
			}
			if tt.lastEvent == protocol.EvTurnEnd {
				if r, _ := lastTurnEnd(evs); r.Kind != protocol.TurnInterrupted || r.Cause != protocol.CauseHostLost {
					t.Fatalf("the open turn was closed with %+v, want interrupted (host lost)", r)
				}
				// The takeover first fenced the log alone and waited for an
				// instance to continue the epoch (none here: no spawn host),
				// then closed the turn past ContinueWaitMax (issue 31, item 2).
				if n := fences(evs); n != 1 {
					t.Fatalf("%d agent/takeover before a turn the takeover closed; want the one it waited after", n)
				}
				if r, _ := runOf(s, runID); r.Result == nil || !strings.Contains(r.Result.Diagnostic, "ContinueWaitMax") || r.Takeovers != 1 {
					t.Fatalf("epoch record %+v (result %+v); want a diagnostic naming ContinueWaitMax and one takeover", r, r.Result)
				}
			}
		})
	}
}

// TestOrphanedRunsAreSettledOnceTheirClaimerIsDead: a run or epoch record
// left running with no lease for its run (docs/design.md §7; docs/protocol.md
// §9.8) is settled never started, once, by the coordinator, only once it is
// due: claimed by a host that stopped heartbeating, HOST_LOST, after the
// host expiry. A one-shot run's log is fenced (its open first turn closed
// as interrupted) and its caller notified; an epoch's log is left as it
// is, also while a later epoch holds the session's lease (a first epoch,
// whose record carries its descriptor, too: the later epoch's open turn is
// not closed). A record claimed
// by a live host, and one never claimed whose start's budget (an hour
// here) has not passed, stay running.
func TestOrphanedRunsAreSettledOnceTheirClaimerIsDead(t *testing.T) {
	s := stack.New(t)
	co := s.AddCoordinator(func(c *coordinator.Config) { c.RequestBudget = time.Hour })
	root := s.Root()
	notices := testutil.Subscribe(t, s.NC, "test.notify.orphan.>")
	openTurn := []protocol.SessionEvent{event(t, protocol.EvTurnStart, protocol.TurnData{Turn: 1})}
	tests := []struct {
		name   string
		mode   string
		host   string
		log    []protocol.SessionEvent
		later  bool // a later epoch, on a live host, holds the session's lease
		desc   bool // the record carries the first epoch's descriptor
		settle bool
		last   string // the type of the log's last event afterwards ("" an empty log)
	}{
		{name: "one-shot claimed by a dead host", mode: protocol.ModeOneShot, host: deadHost, settle: true, last: protocol.EvAgentTakeover},
		{name: "one-shot claimed by a dead host that opened its first turn", mode: protocol.ModeOneShot, host: deadHost, log: openTurn,
			settle: true, last: protocol.EvTurnEnd},
		{name: "epoch claimed by a dead host", mode: protocol.ModeContinuable, host: deadHost, settle: true},
		{name: "epoch claimed by a dead host while a later epoch holds the lease", mode: protocol.ModeContinuable, host: deadHost,
			log: openTurn, later: true, settle: true, last: protocol.EvTurnStart},
		{name: "first epoch claimed by a dead host while a later epoch holds the lease and has a turn open", mode: protocol.ModeContinuable,
			host: deadHost, log: append([]protocol.SessionEvent{descriptorEvent(t)}, openTurn...), later: true, desc: true, settle: true,
			last: protocol.EvTurnStart},
		{name: "one-shot claimed by a live host", mode: protocol.ModeOneShot, host: co.ID(), last: ""},
		{name: "one-shot never claimed within its start's budget", mode: protocol.ModeOneShot, last: ""},
	}
	runID := func(i int) string { return fmt.Sprintf("run-orphan-%d", i) }
	for i, tt := range tests {
		child := fmt.Sprintf("orphan-%d", i)
		putChild(t, s, root, child, tt.log...)
		now := store.NowMs()
		rec := protocol.RunRecord{RunID: runID(i), ChildID: child, ParentSession: root.SessionID, Provider: "spawn", Mode: tt.mode,
			State: protocol.RunRunning, CreatedAt: now, HostID: tt.host}
		if tt.host != "" {
			rec.StartedAt = now
		}
		if tt.mode == protocol.ModeOneShot {
			rec.Notify = "test.notify.orphan." + rec.RunID
		}
		if tt.desc {
			d := continuableDescriptor()
			rec.Descriptor = &d
		}
		putRun(t, s, rec)
		if tt.later {
			l := deadLease(root, child, "later-"+rec.RunID, protocol.AgentContinuable, 1)
			l.HostID = co.ID() // the coordinator's heartbeat stands in for the later epoch's worker
			putLease(t, s, l)
		}
	}
	for i, tt := range tests {
		if !tt.settle {
			continue
		}
		testutil.Eventually(t, 30*time.Second, func() bool {
			r, err := runOf(s, runID(i))
			return err == nil && r.State == protocol.RunSettled
		}, "%s: the orphaned record is settled", tt.name)
	}
	// The records not due stay running for three more host expiries (a
	// dozen sweeps) after the others settled.
	testutil.Consistently(t, 3*stack.HostExpiry, func() bool {
		for i, tt := range tests {
			if r, err := runOf(s, runID(i)); !tt.settle && (err != nil || r.State != protocol.RunRunning) {
				t.Logf("%s: %+v (%v)", tt.name, r, err)
				return false
			}
		}
		return true
	}, "a record claimed by a live host or within its start's budget stays running")
	if err := s.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	for i, tt := range tests {
		if !tt.settle {
			continue
		}
		r, _ := runOf(s, runID(i))
		if !r.NotStarted || r.SettledBy != co.ID() || r.Result == nil || r.Result.StopReason != protocol.StopError ||
			r.Result.ErrorCode != protocol.CodeHostLost {
			t.Errorf("%s: settled as %+v (result %+v), want never started, error/HOST_LOST, by the coordinator", tt.name, r, r.Result)
		}
		_, evs := s.Log(r.ChildID)
		last := ""
		if len(evs) > 0 {
			last = evs[len(evs)-1].Type
		}
		// A one-shot run's log gets one event (a fence, or the closing of
		// its open turn); an epoch's is left as it was.
		want := len(tt.log)
		if tt.mode == protocol.ModeOneShot {
			want++
		}
		if last != tt.last || len(evs) != want {
			t.Errorf("%s: the log afterwards %+v, want %d events ending with %q", tt.name, evs, want, tt.last)
		}
		if tt.last == protocol.EvTurnEnd {
			if reason, _ := lastTurnEnd(evs); reason.Kind != protocol.TurnInterrupted || reason.Cause != protocol.CauseHostLost {
				t.Errorf("%s: the first turn was closed with %+v, want interrupted (host lost)", tt.name, reason)
			}
		}
	}
	// One notice per settled one-shot run, to its caller.
	got := map[string]int{}
	for len(notices) > 0 {
		m := <-notices
		got[m.Subject]++
	}
	for i, tt := range tests {
		want := 0
		if tt.settle && tt.mode == protocol.ModeOneShot {
			want = 1
		}
		if n := got["test.notify.orphan."+runID(i)]; n != want {
			t.Errorf("%s: %d notices, want %d", tt.name, n, want)
		}
	}
}

// TestAnUnclaimedOrphanIsSettledOnceItsStartsBudgetPassed: a run record no
// instance claimed (its coordinator died before it could settle it) is
// settled never started, UNAVAILABLE, only once the start's budget and the
// host expiry passed since it was created (docs/protocol.md §9.8): a start
// still within its budget may yet be claimed.
func TestAnUnclaimedOrphanIsSettledOnceItsStartsBudgetPassed(t *testing.T) {
	s := stack.New(t)
	const budget = 2 * time.Second
	co := s.AddCoordinator(func(c *coordinator.Config) { c.RequestBudget = budget })
	root := s.Root()
	notices := testutil.Subscribe(t, s.NC, "test.notify.unclaimed")
	const child, runID = "unclaimed-orphan", "run-of-an-unclaimed-orphan"
	putChild(t, s, root, child)
	created := store.NowMs()
	putRun(t, s, protocol.RunRecord{RunID: runID, ChildID: child, ParentSession: root.SessionID, Provider: "spawn",
		Mode: protocol.ModeOneShot, State: protocol.RunRunning, CreatedAt: created, Notify: "test.notify.unclaimed"})
	testutil.Eventually(t, 30*time.Second, func() bool {
		r, err := runOf(s, runID)
		return err == nil && r.State == protocol.RunSettled
	}, "the unclaimed record is settled")
	r, _ := runOf(s, runID)
	if !r.NotStarted || r.SettledBy != co.ID() || r.Result == nil || r.Result.ErrorCode != protocol.CodeUnavailable {
		t.Fatalf("settled as %+v (result %+v), want never started, UNAVAILABLE, by the coordinator", r, r.Result)
	}
	if due := created + (budget + stack.HostExpiry).Milliseconds(); r.SettledAt < due {
		t.Fatalf("settled %d ms after it was created, before the start's budget and the host expiry (%d ms) passed",
			r.SettledAt-created, due-created)
	}
	if _, evs := s.Log(child); len(evs) != 0 {
		t.Fatalf("an unclaimed run's log was written: %+v", evs)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return len(notices) > 0 }, "the caller's notice")
}

// TestPendingMessagesOfADeadHostsEpochResumeAtOnce: the messages a
// continuable child accepted are resumed on a live host as soon as the
// coordinator ended the epoch of its dead host, not at the next liveness
// sweep (an hour here; docs/design.md §4, Liveness): whether the host took the
// child's lease (a takeover) or died before (an orphaned epoch record). A
// first epoch's descriptor, which the dead host never logged, is logged
// from its record so the child can be resumed (RELIABILITY.md, I6).
func TestPendingMessagesOfADeadHostsEpochResumeAtOnce(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.LivenessInterval = time.Hour })
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	root := s.Root()
	for i, leased := range []bool{true, false} {
		name := map[bool]string{true: "its lease taken over", false: "orphaned before its lease"}[leased]
		t.Run(name, func(t *testing.T) {
			child, runID := fmt.Sprintf("resumed-after-a-dead-host-%d", i), fmt.Sprintf("epoch-of-a-dead-host-%d", i)
			putChild(t, s, root, child)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			msg, _, err := s.Store.Enqueue(ctx, testutil.ScopeOf(t, s.Store, child), child, store.InboxItem{Content: protocol.Text("say resumed"),
				Source: protocol.MessageSource{Kind: protocol.SourceUser}, Delivery: store.DeliveryNextTurn}, "")
			if err != nil {
				t.Fatal(err)
			}
			d := continuableDescriptor()
			now := store.NowMs()
			putRun(t, s, protocol.RunRecord{RunID: runID, ChildID: child, ParentSession: root.SessionID, Provider: "spawn",
				Mode: protocol.ModeContinuable, State: protocol.RunRunning, CreatedAt: now, StartedAt: now, HostID: deadHost, Descriptor: &d})
			if leased {
				putLease(t, s, deadLease(root, child, runID, protocol.AgentContinuable, 0))
			}
			testutil.Eventually(t, 45*time.Second, func() bool {
				items, err := testutil.InboxOf(t, s.Store, child).Pending(ctx, 0)
				if err != nil || len(items) > 0 {
					return false
				}
				_, evs := s.Log(child)
				r, ok := lastTurnEnd(evs)
				return ok && r.Kind == protocol.TurnCompleted
			}, "the message %s runs on the live worker", msg)
			_, evs := s.Log(child)
			if evs[0].Type != protocol.EvSubagentDescriptor {
				t.Fatalf("the log begins with %s, want the descriptor the epoch record carries", evs[0].Type)
			}
			// Taken over before its first turn, the epoch ends completed;
			// orphaned, it was never started (HOST_LOST).
			want := map[bool]protocol.Code{true: "", false: protocol.CodeHostLost}[leased]
			if r, err := runOf(s, runID); err != nil || r.State != protocol.RunSettled || r.Result == nil || r.Result.ErrorCode != want || r.NotStarted == leased {
				t.Fatalf("the dead host's epoch record %+v (%v), want it settled with %q", r, err, want)
			}
		})
	}
}

// TestAStalledTakeoverWritesNothingOnceSuperseded (RELIABILITY.md, open
// finding 1 of the short chaos seed): coordinator A takes over the lease
// of a continuable child whose host died and stalls right after its
// compare-and-set landed (isolated: its heartbeats fail too). Coordinator
// B judges A dead, takes the session over in turn, closes the dead host's
// turn, settles the epoch and releases the lease, and a new epoch starts on
// a live host with an open turn. When A comes back, its takeover must see
// that the lease moved on and write nothing: the new epoch's turn stays
// open, its lease and record untouched (before the fix, A's closing of the
// open turn, fenced only on the log's last record, closed the new epoch's
// turn as interrupted and its worker stopped, fenced, for good).
func TestAStalledTakeoverWritesNothingOnceSuperseded(t *testing.T) {
	s := stack.New(t)
	const child, runID, nextRun = "stalled-takeover", "epoch-of-a-dead-host", "epoch-after-the-takeovers"
	const idA, idB = "coordinator-a", "coordinator-b"
	agents := s.Store.Agents.Bucket()
	var down atomic.Bool
	var stallOnce sync.Once
	stalled, release := make(chan struct{}), make(chan struct{})
	s.AddCoordinator(func(c *coordinator.Config) {
		c.ID = idA
		hosts := c.Store.Hosts.Bucket()
		c.Store = c.Store.WithFaults(store.Faults{
			Before: func(_ context.Context, w store.Write) error {
				if w.Op == store.OpKVPut && w.Bucket == hosts && down.Load() {
					return testutil.ErrPaused
				}
				return nil
			},
			After: func(_ context.Context, w store.Write, err error) error {
				var l protocol.AgentRecord
				if err != nil || w.Op != store.OpKVUpdate || w.Bucket != agents ||
					protocol.Unmarshal(protocol.Msgpack, w.Value, &l) != nil || l.SessionID != child || l.TakenOverBy != idA {
					return err
				}
				stallOnce.Do(func() {
					down.Store(true)
					close(stalled)
					<-release
					down.Store(false)
				})
				return err
			},
		})
	})
	root := s.Root()
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	putChild(t, s, root, child, descriptorEvent(t),
		event(t, protocol.EvTurnStart, protocol.TurnData{Turn: 1}), event(t, protocol.EvStepStart, protocol.StepData{Turn: 1, Step: 1}))
	now := store.NowMs()
	putRun(t, s, protocol.RunRecord{RunID: runID, ChildID: child, ParentSession: root.SessionID, Provider: "spawn",
		Mode: protocol.ModeContinuable, State: protocol.RunRunning, CreatedAt: now, StartedAt: now, HostID: deadHost})
	putLease(t, s, deadLease(root, child, runID, protocol.AgentContinuable, 1))
	select {
	case <-stalled:
	case <-time.After(time.Minute):
		t.Fatal("coordinator A never took the lease over")
	}

	b := s.AddCoordinator(func(c *coordinator.Config) { c.ID = idB })
	testutil.Eventually(t, 60*time.Second, func() bool {
		r, err := runOf(s, runID)
		return err == nil && r.State == protocol.RunSettled && r.SettledBy == b.ID() && !leaseHeld(t, s, child)
	}, "coordinator B settles the epoch of the dead host and releases the lease")
	_, evs := s.Log(child)
	if r, _ := lastTurnEnd(evs); r.Kind != protocol.TurnInterrupted {
		t.Fatalf("B closed the dead host's turn with %+v, want interrupted", r)
	}

	// A new epoch, on a live host (B's heartbeat stands in for its
	// worker's), takes the lease and opens a turn.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log, err := s.Store.ReadLog(ctx, "spawn", child)
	if err != nil {
		t.Fatal(err)
	}
	now = store.NowMs()
	putRun(t, s, protocol.RunRecord{RunID: nextRun, ChildID: child, ParentSession: root.SessionID, Provider: "spawn",
		Mode: protocol.ModeContinuable, State: protocol.RunRunning, CreatedAt: now, StartedAt: now, HostID: b.ID()})
	next := deadLease(root, child, nextRun, protocol.AgentContinuable, int64(len(log.Events)))
	next.HostID = b.ID()
	putLease(t, s, next)
	lease, err := store.GetLatest[protocol.AgentRecord](ctx, s.Store.Agents, store.LeaseKey("spawn", child))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store.NewLogWriter("spawn", child, log.LastSubjSeq, int64(len(log.Events))).
		Append(ctx, event(t, protocol.EvTurnStart, protocol.TurnData{Turn: 2})); err != nil {
		t.Fatal(err)
	}
	want := len(log.Events) + 1

	close(release) // A comes back and goes on with its takeover
	testutil.Consistently(t, 3*stack.HostExpiry, func() bool {
		_, evs := s.Log(child)
		l, err := store.GetLatest[protocol.AgentRecord](ctx, s.Store.Agents, store.LeaseKey("spawn", child))
		r, rerr := runOf(s, nextRun)
		if len(evs) != want || evs[want-1].Type != protocol.EvTurnStart || err != nil || l.Revision != lease.Revision ||
			rerr != nil || r.State != protocol.RunRunning {
			t.Logf("log %+v; lease %+v (%v); record %+v (%v)", evs[len(log.Events):], l, err, r, rerr)
			return false
		}
		return true
	}, "the new epoch's turn stays open, its lease and record untouched, once A is back")
}

// TestAFollowupIsAcceptedWhileItsChildChangesHands (issue 12, point 3): a
// followup to a continuable child whose host died is answered once its
// message is in the inbox, while a takeover of the child's lease is still
// in progress: whether the child is resident or cold is read from the
// bucket after the reply, and the resume waits out the takeover there.
// Before, the accept read the lease first and waited for the takeover (up
// to residentWaitMax, 10 s) and answered UNAVAILABLE ("changing hands")
// when the caller's budget ran out first. Once the takeover lets go, the
// message runs, once, on the live worker.
func TestAFollowupIsAcceptedWhileItsChildChangesHands(t *testing.T) {
	s := stack.New(t)
	c := s.AddCoordinator(func(c *coordinator.Config) { c.LivenessInterval = time.Hour })
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	root := s.Root()
	const child, runID = "followed-up-while-taken-over", "epoch-of-a-dead-host"
	putChild(t, s, root, child, descriptorEvent(t))
	d := continuableDescriptor()
	now := store.NowMs()
	putRun(t, s, protocol.RunRecord{RunID: runID, ChildID: child, ParentSession: root.SessionID, Provider: "spawn",
		Mode: protocol.ModeContinuable, State: protocol.RunRunning, CreatedAt: now, StartedAt: now, HostID: deadHost, Descriptor: &d})
	putLease(t, s, deadLease(root, child, runID, protocol.AgentContinuable, 0))
	release := c.HoldTakeover(child) // a takeover of this replica's, in progress
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	ref := root.Ref()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r, err := s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: child, Authority: protocol.Authority{Parent: &ref}, Message: protocol.Text("say resumed")})
	if err != nil || r.MessageID == "" || r.Held != "" {
		t.Fatalf("followup while the child's lease is being taken over: %+v, %v; want it accepted", r, err)
	}
	if !leaseHeld(t, s, child) {
		t.Fatal("the dead host's lease is gone before the takeover let go")
	}
	release()
	released = true
	testutil.Eventually(t, 45*time.Second, func() bool {
		items, err := testutil.InboxOf(t, s.Store, child).Pending(context.Background(), 0)
		if err != nil || len(items) > 0 {
			return false
		}
		_, evs := s.Log(child)
		r, ok := lastTurnEnd(evs)
		return ok && r.Kind == protocol.TurnCompleted
	}, "the message %s runs on the live worker", r.MessageID)
	_, evs := s.Log(child)
	claims := 0
	for _, ev := range evs {
		if ev.Type == protocol.EvUserMessage {
			var m protocol.UserMessageData
			if err := ev.Decode(&m); err != nil {
				t.Fatal(err)
			}
			if m.ID == r.MessageID {
				claims++
			}
		}
	}
	if claims != 1 {
		t.Fatalf("the message %s is in the log %d times, want once", r.MessageID, claims)
	}
}

// TestAnEpochWaitingToBeContinuedCountsAgainstTheLiveLimit: a continuable
// child's epoch taken over from a dead host with its turn open waits for an
// instance to continue it (docs/protocol.md §8.4), and may become live again
// on one at any moment, so it counts against its parent's live-children
// limit meanwhile, as a one-shot run waiting so does (RELIABILITY.md I8):
// with the limit 1, a continuable.start beside it waits in the start queue
// (and, with the queue off, is LIMIT_EXCEEDED). The
// waiting child is a fork child, and no fork instance runs, so it waits
// for the whole test.
func TestAnEpochWaitingToBeContinuedCountsAgainstTheLiveLimit(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) {
		c.LiveChildrenMax = 1
		c.ContinueWaitMax = time.Minute
	})
	s.AddSpawnWorker()
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const child, runID = "epoch-waiting-for-an-instance", "epoch-run-waiting-for-an-instance"
	waitingEpoch(t, s, root, child, runID)
	r, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "beside", Prompt: protocol.Text("say ok")})
	if err != nil || r.State != protocol.StateQueued {
		t.Fatalf("continuable.start beside an epoch waiting to be continued: %+v, %v; want it queued", r, err)
	}
	off := stack.New(t)
	off.AddCoordinator(func(c *coordinator.Config) {
		c.LiveChildrenMax, c.StartQueueMax = 1, -1 // refused at the limit, not queued
		c.ContinueWaitMax = time.Minute
	})
	off.AddSpawnWorker()
	offRoot := off.Root()
	waitingEpoch(t, off, offRoot, child, runID)
	_, err = off.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: offRoot.Ref(), Label: "beside", Prompt: protocol.Text("say ok")})
	if protocol.CodeOf(err) != protocol.CodeLimitExceeded {
		t.Fatalf("continuable.start beside an epoch waiting to be continued, no start queue: %v; want LIMIT_EXCEEDED", err)
	}
}

// waitingEpoch puts a continuable fork child of root whose host died with
// its turn open, and waits until a coordinator took it over and fenced its
// log, waiting for an instance to continue it (none: no fork host runs).
func waitingEpoch(t *testing.T, s *stack.Stack, root *client.Root, child, runID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	desc := continuableDescriptor()
	desc.Provider = "fork"
	putChildOf(t, s, root, "fork", child, event(t, protocol.EvSubagentDescriptor, desc),
		event(t, protocol.EvTurnStart, protocol.TurnData{Turn: 1}), event(t, protocol.EvStepStart, protocol.StepData{Turn: 1, Step: 1}))
	now := store.NowMs()
	putRun(t, s, protocol.RunRecord{RunID: runID, ChildID: child, ParentSession: root.SessionID, Provider: "fork",
		Mode: protocol.ModeContinuable, State: protocol.RunRunning, CreatedAt: now, StartedAt: now, HostID: deadHost})
	lease := deadLease(root, child, runID, protocol.AgentContinuable, 1)
	lease.Provider = "fork"
	putLease(t, s, lease)
	testutil.Eventually(t, 20*time.Second, func() bool {
		l, err := store.GetLatest[protocol.AgentRecord](ctx, s.Store.Agents, store.LeaseKey("fork", child))
		return err == nil && l.Value.TakenOverBy != ""
	}, "the epoch taken over, waiting for an instance")
	_, evs := s.Log(child)
	if fences(evs) != 1 || evs[len(evs)-1].Type != protocol.EvAgentTakeover {
		t.Fatalf("the log %v; want the open turn fenced by one agent/takeover and left open", evs)
	}
}

// TestARunUnderAnEndedAncestorIsNotOfferedAContinuation (issue 31, item 2):
// a one-shot run whose host died with its turn open, under a one-shot
// ancestor that has ended (its dispose reached no one, the run's host being
// dead), is not offered to an instance to continue: the coordinator closes
// the turn interrupted at once and settles the run error HOST_LOST, its
// diagnostic naming the ended ancestor (before, it waited ContinueWaitMax,
// a minute here, for an instance to continue it).
func TestARunUnderAnEndedAncestorIsNotOfferedAContinuation(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.ContinueWaitMax = time.Minute })
	root := s.Root()
	const anc, child, runID = "ended-one-shot-ancestor", "child-under-an-ended-ancestor", "run-under-an-ended-ancestor"
	oneShot := protocol.DescriptorData{Version: protocol.DescriptorVersion, Mode: protocol.ModeOneShot, Provider: "spawn"}
	// The ancestor: a one-shot child of root whose run ended (no lease).
	putChild(t, s, root, anc, event(t, protocol.EvSubagentDescriptor, oneShot))
	putChild(t, s, root, child, event(t, protocol.EvSubagentDescriptor, oneShot),
		event(t, protocol.EvTurnStart, protocol.TurnData{Turn: 1}), event(t, protocol.EvStepStart, protocol.StepData{Turn: 1, Step: 1}))
	now := store.NowMs()
	putRun(t, s, protocol.RunRecord{RunID: runID, ChildID: child, ParentSession: root.SessionID, Provider: "spawn",
		Mode: protocol.ModeOneShot, State: protocol.RunRunning, CreatedAt: now, StartedAt: now, HostID: deadHost})
	lease := deadLease(root, child, runID, protocol.AgentOneShot, 0)
	lease.Ancestry = []string{root.SessionID, anc}
	putLease(t, s, lease)
	testutil.Eventually(t, 20*time.Second, func() bool {
		r, err := runOf(s, runID)
		return err == nil && r.State == protocol.RunSettled
	}, "the run settled without waiting for an instance")
	r, _ := runOf(s, runID)
	if r.Result == nil || r.Result.StopReason != protocol.StopError || r.Result.ErrorCode != protocol.CodeHostLost ||
		!strings.Contains(r.Result.Diagnostic, anc) {
		t.Fatalf("run record %+v (result %+v); want error HOST_LOST with a diagnostic naming the ended ancestor", r, r.Result)
	}
	_, evs := s.Log(child)
	end, ok := sessionlog.LastTurnEnd(evs)
	if !ok || end.Reason.Kind != protocol.TurnInterrupted || end.Reason.Cause != protocol.CauseHostLost {
		t.Fatalf("last turn/end %+v (%v); want the turn closed interrupted{host-lost}", end, ok)
	}
}
