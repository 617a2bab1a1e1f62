package agent_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// materialize builds an agent of session id from its log in JetStream, as a
// host does when it takes a session over.
func materialize(t *testing.T, st *store.Store, id string) *agent.Agent {
	t.Helper()
	log, err := st.ReadLog(context.Background(), protocol.ScopeRoot, id)
	if err != nil {
		t.Fatal(err)
	}
	reg, _ := agent.NewRegistry(agent.ListDirTool(agent.AnyWorkspace))
	a, err := agent.New(agent.Config{
		Header: protocol.SessionHeader{ID: id, Cwd: t.TempDir()}, Events: log.Events,
		Log: st.NewLogWriter(protocol.ScopeRoot, id, log.LastSubjSeq, int64(len(log.Events))), Model: model.NewScripted(), Tools: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func enqueue(t *testing.T, st *store.Store, id, text, key string) string {
	t.Helper()
	mid, _, err := st.Enqueue(context.Background(), protocol.ScopeRoot, id, store.InboxItem{
		Content: protocol.Text(text), Source: protocol.MessageSource{Kind: protocol.SourceUser},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	return mid
}

// enqueueCopy stores a second copy of message mid (text, as enqueue stored
// it) in session id's inbox, as a stream that forgot mid's msg id stores a
// keyed retry again (store.KeyedMessageID): the copy carries mid and is
// deduplicated only under a msg id of its own.
func enqueueCopy(t *testing.T, st *store.Store, id, text, mid string) {
	t.Helper()
	data, err := protocol.Marshal(protocol.Msgpack, store.InboxItem{
		MessageID: mid, Content: protocol.Text(text), Source: protocol.MessageSource{Kind: protocol.SourceUser}, Delivery: store.DeliveryNextTurn,
	})
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(st.Subj.Inbox(protocol.ScopeRoot, id))
	msg.Data = data
	msg.Header.Set(protocol.HeaderMessageID, mid)
	if _, err := st.JS.PublishMsg(context.Background(), msg, jetstream.WithMsgID(id+".forgotten")); err != nil {
		t.Fatal(err)
	}
}

// claimEach claims the next item of in and runs its turn, until none is
// left or three were claimed (the tests that use it enqueue three at most).
func claimEach(t *testing.T, a *agent.Agent, in agent.Inbox) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if _, ok, err := a.ClaimNext(ctx, in); err != nil {
			t.Fatal(err)
		} else if !ok {
			return
		}
		a.RunSteps(ctx)
	}
}

// stuckInbox loses the first Remove, as a host that dies right after logging
// a claim would.
type stuckInbox struct {
	agent.Inbox
	dropped atomic.Bool
}

func (s *stuckInbox) Remove(ctx context.Context, seqs ...protocol.Seq) error {
	if s.dropped.CompareAndSwap(false, true) {
		return nil
	}
	return s.Inbox.Remove(ctx, seqs...)
}

func claimedIDs(evs []protocol.SessionEvent) []string {
	var out []string
	for _, ev := range evs {
		if ev.Type == protocol.EvInboxDequeue {
			var d protocol.InboxDequeueData
			_ = ev.Decode(&d)
			out = append(out, d.MessageID)
		}
	}
	return out
}

func TestInboxClaimsExactlyOnceAcrossRebuilds(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	const id = "CHILD"
	m1 := enqueue(t, st, id, "say one", "")
	m2 := enqueue(t, st, id, "say two", "")
	m3 := enqueue(t, st, id, "say three", "")

	a := materialize(t, st, id)
	inbox := &stuckInbox{Inbox: st.InboxOf(protocol.ScopeRoot, id)}
	if _, ok, err := a.ClaimNext(ctx, inbox); !ok || err != nil {
		t.Fatalf("first claim: %v %v", ok, err)
	}
	// The host dies here: the claim of m1 is logged, the item is still in the stream.
	if items := pendingIDs(t, st, id); len(items) != 3 {
		t.Fatalf("%d items pending; the first removal was lost on purpose", len(items))
	}

	b := materialize(t, st, id) // a second instance rebuilt from the log
	b.RunSteps(ctx)             // it finishes the open turn the first one left
	for i := 0; i < 2; i++ {
		if _, ok, err := b.ClaimNext(ctx, st.InboxOf(protocol.ScopeRoot, id)); !ok || err != nil {
			t.Fatalf("claim %d: %v %v", i, ok, err)
		}
		b.RunSteps(ctx)
	}
	// Delivery repeats: nothing is left to claim.
	if _, ok, err := b.ClaimNext(ctx, st.InboxOf(protocol.ScopeRoot, id)); ok || err != nil {
		t.Fatalf("claimed again: %v %v", ok, err)
	}
	log, _ := st.ReadLog(ctx, protocol.ScopeRoot, id)
	got := claimedIDs(log.Events)
	if len(got) != 3 || got[0] != m1 || got[1] != m2 || got[2] != m3 {
		t.Fatalf("claims = %v, want [%s %s %s] exactly once each, in order", got, m1, m2, m3)
	}
	if items := pendingIDs(t, st, id); len(items) != 0 {
		t.Fatalf("%d items still pending; the stream must hold exactly what is pending", len(items))
	}
	// Each turn answered its own message.
	var answers []string
	for _, ev := range log.Events {
		if ev.Type == protocol.EvAssistantMessage {
			var d protocol.AssistantMessageData
			_ = ev.Decode(&d)
			answers = append(answers, protocol.PlainText(d.Message.Content))
		}
	}
	if len(answers) != 3 || answers[0] != "one" || answers[1] != "two" || answers[2] != "three" {
		t.Fatalf("answers = %v", answers)
	}
}

func TestInboxCancelWithAndWithoutKeepingItems(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	const id = "C2"
	enqueue(t, st, id, "sleep 30s\nsay never", "")
	a := materialize(t, st, id)
	if _, ok, _ := a.ClaimNext(ctx, st.InboxOf(protocol.ScopeRoot, id)); !ok {
		t.Fatal("no claim")
	}
	queued := enqueue(t, st, id, "say queued", "")
	if err := a.NoteEnqueued(ctx, st.InboxOf(protocol.ScopeRoot, id)); err != nil {
		t.Fatal(err)
	}
	// Cancel the turn keeping the inbox: the queued item stays pending.
	tctx, cancel := context.WithCancelCause(ctx)
	go func() { time.Sleep(50 * time.Millisecond); cancel(&agent.Cancel{Cause: protocol.CauseUser}) }()
	if out := a.RunSteps(tctx); out.Reason.Kind != protocol.TurnAborted {
		t.Fatalf("turn end = %+v", out.Reason)
	}
	if items := pendingIDs(t, st, id); len(items) != 1 || items[0] != queued {
		t.Fatalf("kept inbox = %+v", items)
	}
	// Cancel without keeping it: the item is discarded after its enqueue.
	n, err := a.DiscardPending(ctx, st.InboxOf(protocol.ScopeRoot, id), "cancelled")
	if err != nil || n != 1 {
		t.Fatalf("discarded %d, %v", n, err)
	}
	log, _ := st.ReadLog(ctx, protocol.ScopeRoot, id)
	var enq, disc int
	for _, ev := range log.Events {
		switch ev.Type {
		case protocol.EvInboxEnqueue:
			enq++
		case protocol.EvInboxDiscard:
			disc++
			if enq < 2 {
				t.Fatal("discard logged before the item's enqueue")
			}
		}
	}
	if enq != 2 || disc != 1 {
		t.Fatalf("enqueue %d, discard %d", enq, disc)
	}
	if _, ok, _ := a.ClaimNext(ctx, st.InboxOf(protocol.ScopeRoot, id)); ok {
		t.Fatal("a discarded item was claimed")
	}
}

func TestInboxIdempotencyAndLimit(t *testing.T) {
	s := testutil.Server(t)
	nc := testutil.Connect(t, s.ClientURL())
	cfg := store.DefaultConfig()
	cfg.InboxItemsMax = 3
	st, err := store.Provision(context.Background(), nc, protocol.MustSubjects(""), cfg)
	if err != nil {
		t.Fatal(err)
	}
	first := enqueue(t, st, "S", "hi", "key-1")
	if again := enqueue(t, st, "S", "hi", "key-1"); again != first {
		t.Fatalf("retry got %s, want the original %s", again, first)
	}
	enqueue(t, st, "S", "b", "")
	enqueue(t, st, "S", "c", "")
	_, _, err = st.Enqueue(context.Background(), protocol.ScopeRoot, "S", store.InboxItem{Content: protocol.Text("d")}, "")
	if protocol.CodeOf(err) != protocol.CodeLimitExceeded {
		t.Fatalf("4th item = %v, want LIMIT_EXCEEDED", err)
	}
}

func TestIdempotentRetryAfterTheClaimAnswersTheOriginalID(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	first := enqueue(t, st, "C", "say hi", "retry-key")
	a := materialize(t, st, "C")
	if _, ok, err := a.ClaimNext(ctx, st.InboxOf(protocol.ScopeRoot, "C")); !ok || err != nil {
		t.Fatalf("claim: %v %v", ok, err)
	}
	a.RunSteps(ctx)
	if again := enqueue(t, st, "C", "say hi", "retry-key"); again != first {
		t.Fatalf("retry after the claim got %q, want the original %s", again, first)
	}
	if items := pendingIDs(t, st, "C"); len(items) != 0 {
		t.Fatal("the retry was stored twice")
	}
}

// TestKeyedMessageStoredTwiceRunsOnce (issue 16, fault 4): a node restarted
// from its store forgets the msg ids of the items already claimed (and
// deleted), so a followup retried with its idempotency key through such a
// leader is stored a second time. The retry carries the original's
// messageId (store.KeyedMessageID), and a claim skips, and removes, an item
// whose messageId the log already claimed: the message runs once. Before,
// the retry got a new messageId and its turn ran again (seen in
// TestLeaderElectionsAreNotFailures).
func TestKeyedMessageStoredTwiceRunsOnce(t *testing.T) {
	s := testutil.Server(t)
	st := testutil.Store(t, testutil.Connect(t, s.ClientURL()))
	ctx := context.Background()
	const id = "C3"
	m1 := enqueue(t, st, id, "say once", "k1")
	if want := store.KeyedMessageID(id, "k1"); m1 != want {
		t.Fatalf("messageId of a keyed item = %s, want %s (derived from the key)", m1, want)
	}
	if again := enqueue(t, st, id, "say once", "k1"); again != m1 {
		t.Fatalf("a retry within the duplicate window answered %s, want %s", again, m1)
	}
	a := materialize(t, st, id)
	if _, ok, err := a.ClaimNext(ctx, st.InboxOf(protocol.ScopeRoot, id)); !ok || err != nil {
		t.Fatalf("first claim: %v %v", ok, err)
	}
	a.RunSteps(ctx)
	// The retry stored again, as a stream that forgot the msg id stores it.
	enqueueCopy(t, st, id, "say once", m1)
	m2 := enqueue(t, st, id, "say after", "k2")
	claimEach(t, a, st.InboxOf(protocol.ScopeRoot, id))
	log, _ := st.ReadLog(ctx, protocol.ScopeRoot, id)
	if got := claimedIDs(log.Events); len(got) != 2 || got[0] != m1 || got[1] != m2 {
		t.Fatalf("claims = %v, want [%s %s]: the second copy of %s is skipped", got, m1, m2, m1)
	}
	if items, _ := st.InboxOf(protocol.ScopeRoot, id).Pending(ctx, 0); len(items) != 0 {
		t.Fatalf("%d items still pending; the copy is removed", len(items))
	}
}

// TestACopyOfAPendingItemGoesOnceItsFirstCopyIsClaimed: an inbox holding
// two copies of one message, both unclaimed (a keyed retry the stream
// stored again, store.KeyedMessageID), runs it once, and asks to remove
// only items its log names as done: a coordinator deletes nothing else
// (store.RemoveDoneInboxItems), so the second copy stays until the first
// copy's claim is logged, then goes. Before, the second copy was removed
// while neither was claimed, a removal a coordinator refuses.
func TestACopyOfAPendingItemGoesOnceItsFirstCopyIsClaimed(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	const id = "C4"
	m1 := enqueue(t, st, id, "say once", "k1")
	enqueueCopy(t, st, id, "say once", m1)
	m2 := enqueue(t, st, id, "say after", "k2")
	// The removals a coordinator would carry out, each checked as it does.
	header := protocol.SessionHeader{ID: id}
	var refused []error
	in := st.InboxOf(protocol.ScopeRoot, id).RemovedBy(func(ctx context.Context, seqs []protocol.Seq) error {
		_, err := st.RemoveDoneInboxItems(ctx, header, seqs)
		if err != nil {
			refused = append(refused, err)
		}
		return err
	})
	a := materialize(t, st, id)
	items, err := a.Unclaimed(ctx, in)
	if err != nil || len(items) != 2 || items[0].MessageID != m1 || items[1].MessageID != m2 {
		t.Fatalf("unclaimed = %+v, %v; want %s then %s, the copy skipped", items, err, m1, m2)
	}
	if got := pendingIDs(t, st, id); len(got) != 3 {
		t.Fatalf("pending %v before any claim; want both copies and %s", got, m2)
	}
	claimEach(t, a, in)
	log, _ := st.ReadLog(ctx, protocol.ScopeRoot, id)
	if got := claimedIDs(log.Events); len(got) != 2 || got[0] != m1 || got[1] != m2 {
		t.Fatalf("claims = %v, want [%s %s]", got, m1, m2)
	}
	if got := pendingIDs(t, st, id); len(got) != 0 {
		t.Fatalf("pending %v; the copy goes once the first copy's claim is logged", got)
	}
	if len(refused) > 0 {
		t.Fatalf("removals refused: %v", refused)
	}
}
