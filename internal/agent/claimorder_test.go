package agent_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// writes records the store writes a test made faulty, and fails or loses
// the answer of the ones it is told to.
type writes struct {
	mu      sync.Mutex
	seen    []store.Write
	fail    func(store.Write) bool // fail before sending
	loseAck func(store.Write) bool // let it land, answer with a timeout
}

func (w *writes) faults() store.Faults {
	return store.Faults{
		Before: func(_ context.Context, wr store.Write) error {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.seen = append(w.seen, wr)
			if w.fail != nil && w.fail(wr) {
				return errors.New("injected: write refused")
			}
			return nil
		},
		After: func(_ context.Context, wr store.Write, err error) error {
			w.mu.Lock()
			defer w.mu.Unlock()
			if err == nil && w.loseAck != nil && w.loseAck(wr) {
				w.loseAck = nil // once
				return nats.ErrTimeout
			}
			return err
		},
	}
}

func (w *writes) count(op store.WriteOp) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, wr := range w.seen {
		if wr.Op == op {
			n++
		}
	}
	return n
}

func pendingIDs(t *testing.T, st *store.Store, id string) []string {
	t.Helper()
	items, err := st.InboxOf(protocol.ScopeRoot, id).Pending(context.Background(), 0)
	if err != nil {
		t.Fatalf("read the inbox of %s: %v", id, err)
	}
	var out []string
	for _, it := range items {
		out = append(out, it.MessageID)
	}
	return out
}

func logOf(t *testing.T, st *store.Store, id string) []protocol.SessionEvent {
	t.Helper()
	log, err := st.ReadLog(context.Background(), protocol.ScopeRoot, id)
	if err != nil {
		t.Fatalf("read the log of %s: %v", id, err)
	}
	return log.Events
}

// TestClaimOrderAnItemLeavesTheInboxOnlyAfterItsClaimIsLogged: the claim of
// an inbox item is logged before the item is removed (docs/design.md §4). When
// the log append that carries the claim fails, the item must still be
// pending, and it is claimed exactly once by the next attempt: a removal
// before the append would lose the accepted message with nothing in the log.
// The same order holds for a discard.
func TestClaimOrderAnItemLeavesTheInboxOnlyAfterItsClaimIsLogged(t *testing.T) {
	for _, tc := range []struct {
		name string
		// act tries to claim or discard the pending item on an agent whose
		// log appends are refused; it reports whether the attempt said it failed.
		act func(ctx context.Context, a *agent.Agent, in agent.Inbox) (failed bool)
		// again does it once more on a healthy agent and says what the log
		// must then record for the item.
		again func(ctx context.Context, a *agent.Agent, in agent.Inbox) error
		want  string
	}{
		{"ClaimNext", func(ctx context.Context, a *agent.Agent, in agent.Inbox) bool {
			_, claimed, _ := a.ClaimNext(ctx, in)
			return !claimed
		}, func(ctx context.Context, a *agent.Agent, in agent.Inbox) error {
			if _, claimed, err := a.ClaimNext(ctx, in); !claimed || err != nil {
				return errors.Join(errors.New("not claimed"), err)
			}
			return nil
		}, protocol.EvInboxDequeue},
		{"DiscardPending", func(ctx context.Context, a *agent.Agent, in agent.Inbox) bool {
			_, err := a.DiscardPending(ctx, in, "cancelled")
			return err != nil
		}, func(ctx context.Context, a *agent.Agent, in agent.Inbox) error {
			n, err := a.DiscardPending(ctx, in, "cancelled")
			if n != 1 || err != nil {
				return errors.Join(errors.New("not discarded"), err)
			}
			return nil
		}, protocol.EvInboxDiscard},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testutil.Server(t)
			st := testutil.Store(t, testutil.Connect(t, s.ClientURL()))
			ctx := context.Background()
			const id = "CLAIMED"
			m1 := enqueue(t, st, id, "say one", "")
			w := &writes{fail: func(wr store.Write) bool {
				return wr.Op == store.OpPublish && wr.Subject == st.Subj.Log(protocol.ScopeRoot, id)
			}}
			faulty := st.WithFaults(w.faults())
			a := materialize(t, faulty, id)
			if !tc.act(ctx, a, faulty.InboxOf(protocol.ScopeRoot, id)) {
				t.Fatal("the attempt succeeded although its log append was refused")
			}
			if n := w.count(store.OpPublish); n == 0 {
				t.Fatal("no log append was attempted")
			}
			if n := w.count(store.OpMsgDelete); n != 0 {
				t.Fatalf("%d inbox items removed although no claim or discard was logged", n)
			}
			if got := pendingIDs(t, st, id); len(got) != 1 || got[0] != m1 {
				t.Fatalf("pending after the refused append = %v, want [%s]", got, m1)
			}
			if evs := logOf(t, st, id); len(evs) != 0 {
				t.Fatalf("the log holds %d events after a refused append", len(evs))
			}
			// A healthy attempt (the host's next, or its successor's).
			b := materialize(t, st, id)
			if err := tc.again(ctx, b, st.InboxOf(protocol.ScopeRoot, id)); err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, ev := range logOf(t, st, id) {
				if ev.Type == tc.want {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("%d %s events for the item, want exactly 1", n, tc.want)
			}
			if got := pendingIDs(t, st, id); len(got) != 0 {
				t.Fatalf("still pending after the logged claim: %v", got)
			}
		})
	}
}

// TestClaimOrderALostAcknowledgementStillCountsTheClaim: the log append that
// carries a claim lands but its acknowledgement is lost (a timeout). The
// writer finds its record in the log (docs/design.md §12), so the claim counts:
// the item is removed, claimed once, and a rebuilt agent claims nothing.
func TestClaimOrderALostAcknowledgementStillCountsTheClaim(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	const id = "ACKLOST"
	m1 := enqueue(t, st, id, "say one", "")
	w := &writes{loseAck: func(wr store.Write) bool {
		return wr.Op == store.OpPublish && wr.Subject == st.Subj.Log(protocol.ScopeRoot, id)
	}}
	faulty := st.WithFaults(w.faults())
	a := materialize(t, faulty, id)
	if _, claimed, err := a.ClaimNext(ctx, faulty.InboxOf(protocol.ScopeRoot, id)); !claimed || err != nil {
		t.Fatalf("claim with a lost acknowledgement: claimed %v, %v", claimed, err)
	}
	w.mu.Lock()
	lost := w.loseAck == nil
	w.mu.Unlock()
	if !lost {
		t.Fatal("no acknowledgement was lost: the test did not reach its fault")
	}
	if got := pendingIDs(t, st, id); len(got) != 0 {
		t.Fatalf("pending after the claim = %v", got)
	}
	a.RunSteps(ctx)
	b := materialize(t, st, id)
	if _, claimed, err := b.ClaimNext(ctx, st.InboxOf(protocol.ScopeRoot, id)); claimed || err != nil {
		t.Fatalf("a rebuilt agent claimed again: %v %v", claimed, err)
	}
	if got := claimedIDs(logOf(t, st, id)); len(got) != 1 || got[0] != m1 {
		t.Fatalf("claims = %v, want [%s] once", got, m1)
	}
}

// TestClaimOrderARemovalThatFailsIsSkippedByTheLoggedClaim: the claim is
// logged and the removal of the item then fails (the host dies between
// them). The item is still in the stream, and no later reader claims it
// again: the logged claim is what counts, and the stale item is removed.
func TestClaimOrderARemovalThatFailsIsSkippedByTheLoggedClaim(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	const id = "NOTREMOVED"
	m1 := enqueue(t, st, id, "say one", "")
	m2 := enqueue(t, st, id, "say two", "")
	w := &writes{fail: func(wr store.Write) bool { return wr.Op == store.OpMsgDelete }}
	faulty := st.WithFaults(w.faults())
	a := materialize(t, faulty, id)
	if _, claimed, err := a.ClaimNext(ctx, faulty.InboxOf(protocol.ScopeRoot, id)); !claimed || err != nil {
		t.Fatalf("claim whose removal fails: claimed %v, %v", claimed, err)
	}
	if w.count(store.OpMsgDelete) == 0 {
		t.Fatal("no removal was attempted")
	}
	if got := pendingIDs(t, st, id); len(got) != 2 {
		t.Fatalf("pending = %v, want both items still in the stream", got)
	}
	a.RunSteps(ctx)
	b := materialize(t, st, id)
	items, err := b.Unclaimed(ctx, st.InboxOf(protocol.ScopeRoot, id))
	if err != nil || len(items) != 1 || items[0].MessageID != m2 {
		t.Fatalf("unclaimed = %+v, %v; want only %s", items, err, m2)
	}
	if got := pendingIDs(t, st, id); len(got) != 1 || got[0] != m2 {
		t.Fatalf("pending after the rebuild = %v, want the claimed item removed", got)
	}
	if _, claimed, err := b.ClaimNext(ctx, st.InboxOf(protocol.ScopeRoot, id)); !claimed || err != nil {
		t.Fatalf("claim of the second item: %v %v", claimed, err)
	}
	if got := claimedIDs(logOf(t, st, id)); len(got) != 2 || got[0] != m1 || got[1] != m2 {
		t.Fatalf("claims = %v, want [%s %s]", got, m1, m2)
	}
}

// withInbox builds an agent of session id, as materialize does, whose
// running turns claim next-step items from in.
func withInbox(t *testing.T, st *store.Store, id string, in agent.Inbox) *agent.Agent {
	t.Helper()
	log, err := st.ReadLog(context.Background(), protocol.ScopeRoot, id)
	if err != nil {
		t.Fatal(err)
	}
	reg, _ := agent.NewRegistry(agent.ListDirTool(agent.AnyWorkspace))
	a, err := agent.New(agent.Config{
		Header: protocol.SessionHeader{ID: id, Cwd: t.TempDir()}, Events: log.Events,
		Log: st.NewLogWriter(protocol.ScopeRoot, id, log.LastSubjSeq, int64(len(log.Events))), Model: model.NewScripted(), Tools: reg,
		Inbox: in,
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func enqueueStep(t *testing.T, st *store.Store, id, text string) string {
	t.Helper()
	mid, _, err := st.Enqueue(context.Background(), protocol.ScopeRoot, id, store.InboxItem{
		Content: protocol.Text(text), Source: protocol.MessageSource{Kind: protocol.SourceUser}, Delivery: store.DeliveryNextStep,
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	return mid
}

// dequeues returns the turn each item's agent/inbox/dequeue names, by messageId.
func dequeues(evs []protocol.SessionEvent) map[string][]int64 {
	out := map[string][]int64{}
	for _, ev := range evs {
		var d protocol.InboxDequeueData
		if ev.Type == protocol.EvInboxDequeue && ev.Decode(&d) == nil {
			out[d.MessageID] = append(out[d.MessageID], d.Turn)
		}
	}
	return out
}

// TestStepClaimsJoinTheRunningTurnOnceLogged: a next-step item that arrives
// while a turn runs joins that turn at its next step, claimed (dequeue and
// user/message, in one record) before the item leaves the inbox. When the
// log refuses that record, the item stays pending and unclaimed.
func TestStepClaimsJoinTheRunningTurnOnceLogged(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		t.Run(map[bool]string{false: "logged", true: "refused"}[refuse], func(t *testing.T) {
			s := testutil.Server(t)
			st := testutil.Store(t, testutil.Connect(t, s.ClientURL()))
			ctx := context.Background()
			const id = "STEPS"
			enqueue(t, st, id, "call list_dir {}\nsay one", "")
			var step string
			w := &writes{}
			if refuse {
				// Refuse exactly the records that claim the next-step item.
				w.fail = func(wr store.Write) bool {
					if wr.Op != store.OpPublish || wr.Subject != st.Subj.Log(protocol.ScopeRoot, id) {
						return false
					}
					var rec protocol.LogRecord
					if protocol.Unmarshal(protocol.Msgpack, wr.Msg.Data, &rec) != nil {
						return false
					}
					for _, ev := range rec.Events {
						var d protocol.InboxDequeueData
						if ev.Type == protocol.EvInboxDequeue && ev.Decode(&d) == nil && d.MessageID == step {
							return true
						}
					}
					return false
				}
			}
			faulty := st.WithFaults(w.faults())
			a := withInbox(t, faulty, id, faulty.InboxOf(protocol.ScopeRoot, id))
			if _, claimed, err := a.ClaimNext(ctx, faulty.InboxOf(protocol.ScopeRoot, id)); !claimed || err != nil {
				t.Fatalf("claim of the turn's message: %v %v", claimed, err)
			}
			step = enqueueStep(t, st, id, "also this")
			next := enqueue(t, st, id, "say next", "") // next-turn: waits for a turn of its own
			a.RunSteps(ctx)
			evs := logOf(t, st, id)
			if d := dequeues(evs)[next]; len(d) != 0 {
				t.Fatalf("a next-turn item was claimed into turns %v of the running turn", d)
			}
			got := dequeues(evs)[step]
			pending := pendingIDs(t, st, id)
			if len(pending) == 0 || pending[len(pending)-1] != next {
				t.Fatalf("pending %v: the next-turn item must still wait", pending)
			}
			pending = pending[:len(pending)-1]
			if refuse {
				if len(got) != 0 || len(pending) != 1 || pending[0] != step {
					t.Fatalf("refused step claim: dequeues %v, pending %v; want no claim and the item pending", got, pending)
				}
				return
			}
			if len(got) != 1 || got[0] != 1 {
				t.Fatalf("the step item was dequeued into turns %v, want [1] (the running turn)", got)
			}
			if len(pending) != 0 {
				t.Fatalf("pending after the step claim: %v", pending)
			}
			users := 0
			for _, ev := range evs {
				var d protocol.UserMessageData
				if ev.Type == protocol.EvUserMessage && ev.Decode(&d) == nil && d.ID == step && d.Turn == 1 {
					users++
				}
			}
			if users != 1 {
				t.Fatalf("%d user/message events for the step item in turn 1, want 1", users)
			}
		})
	}
}

// TestNoteEnqueuedLogsEachArrivalOnce: items that arrive while a turn runs
// are logged as agent/inbox/enqueue once, however often the agent looks,
// and a look that finds nothing new writes nothing.
func TestNoteEnqueuedLogsEachArrivalOnce(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	const id = "ARRIVALS"
	enqueue(t, st, id, "say one", "")
	a := materialize(t, st, id)
	if _, claimed, err := a.ClaimNext(ctx, st.InboxOf(protocol.ScopeRoot, id)); !claimed || err != nil {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	m2 := enqueue(t, st, id, "say two", "")
	enqueued := func() []string {
		var out []string
		for _, ev := range logOf(t, st, id) {
			var d protocol.InboxEnqueueData
			if ev.Type == protocol.EvInboxEnqueue && ev.Decode(&d) == nil {
				out = append(out, d.MessageID)
			}
		}
		return out
	}
	before := len(enqueued())
	for i := 0; i < 2; i++ {
		if err := a.NoteEnqueued(ctx, st.InboxOf(protocol.ScopeRoot, id)); err != nil {
			t.Fatal(err)
		}
	}
	got := enqueued()
	if len(got) != before+1 || got[len(got)-1] != m2 {
		t.Fatalf("enqueue events %v (were %d), want %s logged once", got, before, m2)
	}
	n := len(logOf(t, st, id))
	if err := a.NoteEnqueued(ctx, st.InboxOf(protocol.ScopeRoot, id)); err != nil {
		t.Fatal(err)
	}
	if after := len(logOf(t, st, id)); after != n {
		t.Fatalf("a look with nothing new wrote %d events", after-n)
	}
}
