package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// putOwner writes a continuable child of root, parent, whose lease is held
// by the live host hostID (its epoch runs there as far as any coordinator
// can tell), and returns its credential.
func putOwner(t *testing.T, s *stack.Stack, root *client.Root, parent, hostID string) string {
	t.Helper()
	putChild(t, s, root, parent, descriptorEvent(t))
	cred := protocol.NewCredential()
	putLease(t, s, protocol.AgentRecord{SessionID: parent, Kind: protocol.AgentContinuable, HostID: hostID, Epoch: 1,
		RunID: "epoch-of-" + parent, Provider: "spawn", CredentialHash: protocol.HashCredential(cred),
		ParentSession: root.SessionID, Ancestry: []string{root.SessionID}, CreatedAt: store.NowMs()})
	return cred
}

// putOwned writes the header of continuable spawn child child of parent
// (itself a child of root), with its descriptor and then events logged.
func putOwned(t *testing.T, s *stack.Stack, parent, child string, events ...protocol.SessionEvent) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Store.PutHeader(ctx, protocol.SessionHeader{Version: protocol.SessionHeaderVersion, ID: child, CreatedAt: store.NowMs(),
		ParentSession: parent, Origin: protocol.OriginSubagent, DelegationDepth: 2, Provider: "spawn"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store.NewLogWriter("spawn", child, 0, 0).Append(ctx, append([]protocol.SessionEvent{descriptorEvent(t)}, events...)...); err != nil {
		t.Fatal(err)
	}
}

// state reads the residency of child with auth.
func state(t *testing.T, s *stack.Stack, child string, auth protocol.Authority) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := s.Client.State(ctx, protocol.ChildRef{ChildID: child, Authority: auth})
	if err != nil {
		t.Logf("state of %s: %v", child, err)
		return ""
	}
	return st.State
}

// TestEveryWakeOfAnOwnedChildRegistersItsEdge (issue 37, item 7): whatever
// wakes a continuable child whose parent is a live continuable agent (the
// parent's followup, a followup as the user, the liveness sweep, the
// takeover of a dead host's epoch), the epoch it wakes names the parent as
// its owner and the parent's ownership record lists the child while it
// runs, so the parent waits for it; when that epoch ends, the parent gets
// that epoch's subagent-settled notice and the edge goes. Before, a
// followup as the user registered no edge and resumed the child with no
// owner: its parent could settle meanwhile and miss the notice.
func TestEveryWakeOfAnOwnedChildRegistersItsEdge(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.LivenessInterval = 300 * time.Millisecond })
	host, _ := s.AddSpawnWorker()
	s.WaitProvider("spawn")
	root := s.Root()
	user := s.Grant()
	const work = "sleep 120s\nsay done"
	for i, path := range []string{"the parent's followup", "a followup as the user", "the liveness sweep", "a takeover"} {
		t.Run(path, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			parent, child := fmt.Sprintf("owner-%d", i), fmt.Sprintf("owned-%d", i)
			cred := putOwner(t, s, root, parent, host.ID())
			putOwned(t, s, parent, child)
			enqueue := func() {
				if _, _, err := s.Store.Enqueue(ctx, "spawn", child, store.InboxItem{Content: protocol.Text(work),
					Source: protocol.MessageSource{Kind: protocol.SourceUser}, Delivery: store.DeliveryNextTurn}, ""); err != nil {
					t.Fatal(err)
				}
			}
			var err error
			switch i {
			case 0:
				_, err = s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: child,
					Authority: protocol.Authority{Parent: &protocol.ParentRef{SessionID: parent, Credential: cred}}, Message: protocol.Text(work)})
			case 1:
				_, err = s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: child, Authority: user, Message: protocol.Text(work)})
			case 2:
				enqueue() // accepted with no followup's resume: the sweep finds it
			case 3:
				// The child's epoch ran on a host that died, with the work
				// accepted and not claimed.
				enqueue()
				d := continuableDescriptor()
				deadRun := "epoch-of-a-dead-host-" + child
				putRun(t, s, protocol.RunRecord{RunID: deadRun, ChildID: child, ParentSession: parent, Provider: "spawn",
					Mode: protocol.ModeContinuable, State: protocol.RunRunning, CreatedAt: store.NowMs(), StartedAt: store.NowMs(), HostID: deadHost, Descriptor: &d})
				putLease(t, s, protocol.AgentRecord{SessionID: child, Kind: protocol.AgentContinuable, HostID: deadHost, Epoch: 1, RunID: deadRun,
					Provider: "spawn", CredentialHash: protocol.HashCredential(protocol.NewCredential()), ParentSession: parent,
					Ancestry: []string{root.SessionID, parent}, CreatedAt: store.NowMs(), EpochStart: 1})
			}
			if err != nil {
				t.Fatal(err)
			}
			var lease protocol.AgentRecord
			testutil.Eventually(t, 45*time.Second, func() bool {
				l, err := store.GetLatest[protocol.AgentRecord](ctx, s.Store.Agents, store.LeaseKey("spawn", child))
				lease = l.Value
				return err == nil && lease.HostID == host.ID() && state(t, s, child, user) == protocol.StateRunning
			}, "the child is woken on the live host and runs its work")
			if lease.Owner != parent {
				t.Errorf("the woken epoch %s names owner %q, want its live continuable parent %s", lease.RunID, lease.Owner, parent)
			}
			own, err := s.Store.OwnershipLatestOf(ctx, "spawn", parent)
			if err != nil || !slices.Contains(own.Value.Children, child) {
				t.Errorf("while the woken child runs, its parent's ownership record is %+v (%v); want it to list %s", own.Value, err, child)
			}
			// The epoch ends (its turn interrupted, nothing else queued):
			// the parent gets that epoch's notice, and owns the child no more.
			if _, err := s.Client.Interrupt(ctx, protocol.InterruptRequest{ChildID: child, Authority: user}); err != nil {
				t.Fatal(err)
			}
			notice := store.KeyedMessageID(parent, "settled-"+lease.RunID)
			testutil.Eventually(t, 30*time.Second, func() bool {
				items, err := testutil.InboxOf(t, s.Store, parent).Pending(ctx, 0)
				if err != nil {
					return false
				}
				return slices.ContainsFunc(items, func(it store.InboxItem) bool {
					return it.MessageID == notice && it.Source.Kind == protocol.SourceSubagentSettled && it.Source.SenderSessionID == child
				})
			}, "the parent gets the settlement notice of the woken epoch %s", lease.RunID)
			testutil.Eventually(t, 15*time.Second, func() bool {
				own, err := s.Store.OwnershipLatestOf(ctx, "spawn", parent)
				return errors.Is(err, store.ErrNotFound) || (err == nil && !slices.Contains(own.Value.Children, child))
			}, "the ended epoch releases its parent's edge")
		})
	}
}

// TestDoneWorkDoesNotResumeItsChild (issue 37, item 7): an inbox item
// whose claim the child's log records, but whose removal keeps failing, is
// done: the liveness sweep must not resume the child for it (each resume
// an epoch with nothing to do, settled at once, its parent notified, at
// every sweep). A child with work that really waits is resumed by the same
// sweeps, and the done item is still there (its removal refused).
func TestDoneWorkDoesNotResumeItsChild(t *testing.T) {
	s := stack.New(t)
	var doneSeq, removals atomic.Uint64
	s.AddCoordinator(func(c *coordinator.Config) {
		c.LivenessInterval = 200 * time.Millisecond
		c.Store = c.Store.WithFaults(store.Faults{Before: func(_ context.Context, w store.Write) error {
			if w.Op == store.OpMsgDelete && w.Seq == doneSeq.Load() {
				removals.Add(1)
				return errors.New("nats: permissions violation: the test refuses this removal")
			}
			return nil
		}})
	})
	host, _ := s.AddSpawnWorker()
	s.WaitProvider("spawn")
	root := s.Root()
	user := s.Grant()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const parent, done, waiting = "owner-of-done-work", "child-with-done-work", "child-with-waiting-work"
	putOwner(t, s, root, parent, host.ID())
	putOwned(t, s, parent, waiting)
	// The done child's item, and its claim in its log: a turn that ran it.
	mid, seq, err := s.Store.Enqueue(ctx, "spawn", done, store.InboxItem{Content: protocol.Text("say once"),
		Source: protocol.MessageSource{Kind: protocol.SourceUser}, Delivery: store.DeliveryNextTurn}, "")
	if err != nil {
		t.Fatal(err)
	}
	doneSeq.Store(uint64(seq))
	putOwned(t, s, parent, done,
		event(t, protocol.EvTurnStart, protocol.TurnData{Turn: 1}),
		event(t, protocol.EvInboxDequeue, protocol.InboxDequeueData{MessageID: mid, InboxSeq: seq, Turn: 1}),
		event(t, protocol.EvUserMessage, protocol.UserMessageData{ID: mid, Turn: 1, Content: protocol.Text("say once"), Source: protocol.MessageSource{Kind: protocol.SourceUser}}),
		event(t, protocol.EvTurnEnd, protocol.TurnEndData{Turn: 1, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}}))
	// Work that waits, for the same sweeps: it runs and its epoch ends.
	if _, _, err := s.Store.Enqueue(ctx, "spawn", waiting, store.InboxItem{Content: protocol.Text("say hi"),
		Source: protocol.MessageSource{Kind: protocol.SourceUser}, Delivery: store.DeliveryNextTurn}, ""); err != nil {
		t.Fatal(err)
	}
	notices := func(from string) int {
		items, err := testutil.InboxOf(t, s.Store, parent).Pending(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, it := range items {
			if it.Source.Kind == protocol.SourceSubagentSettled && it.Source.SenderSessionID == from {
				n++
			}
		}
		return n
	}
	testutil.Eventually(t, 45*time.Second, func() bool {
		return notices(waiting) == 1 && state(t, s, waiting, user) == protocol.StateNone && removals.Load() > 0
	}, "the sweeps resume the child whose work waits, its epoch ends, and the done item's removal is tried")
	// A resumed epoch of the done child, started by the same sweep as the
	// waiting child's, would be over as soon as that one.
	if n := notices(done); n != 0 {
		t.Fatalf("the child whose only item is done was resumed: its parent got %d settlement notices", n)
	}
	if _, err := store.GetLatest[protocol.AgentRecord](ctx, s.Store.Agents, store.LeaseKey("spawn", done)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the child whose only item is done holds a lease (%v)", err)
	}
	items, err := testutil.InboxOf(t, s.Store, done).Pending(ctx, 0)
	if err != nil || len(items) != 1 {
		t.Fatalf("the done item whose removal is refused: %d items (%v)", len(items), err)
	}
}
