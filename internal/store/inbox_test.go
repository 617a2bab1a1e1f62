package store_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/tracecontext"
)

// TestEnqueueKeepsWhatAnItemSays: an item without a delivery is next-turn
// and one with a delivery keeps it; a retry with the same idempotency key
// answers the original messageId and sequence and stores nothing more; the
// trace context of the request that accepted an item travels with it.
func TestEnqueueKeepsWhatAnItemSays(t *testing.T) {
	s := testutil.Server(t)
	st := testutil.Store(t, testutil.Connect(t, s.ClientURL()))
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const tracestate = "vendor=value"
	ctx := tracecontext.Extract(context.Background(), nats.Header{tracecontext.HeaderTraceparent: {traceparent}, tracecontext.HeaderTracestate: {tracestate}})

	plain, _, err := st.Enqueue(ctx, protocol.ScopeRoot, "S", store.InboxItem{Content: protocol.Text("a")}, "")
	if err != nil {
		t.Fatal(err)
	}
	step, _, err := st.Enqueue(context.Background(), protocol.ScopeRoot, "S", store.InboxItem{Content: protocol.Text("b"), Delivery: store.DeliveryNextStep}, "")
	if err != nil {
		t.Fatal(err)
	}
	keyed, seq, err := st.Enqueue(context.Background(), protocol.ScopeRoot, "S", store.InboxItem{Content: protocol.Text("c")}, "key-1")
	if err != nil {
		t.Fatal(err)
	}
	again, seq2, err := st.Enqueue(context.Background(), protocol.ScopeRoot, "S", store.InboxItem{Content: protocol.Text("c")}, "key-1")
	if err != nil || again != keyed || seq2 != seq {
		t.Fatalf("retry with the same key = %s@%d, %v; want the original %s@%d", again, seq2, err, keyed, seq)
	}
	items, err := st.InboxOf(protocol.ScopeRoot, "S").Pending(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 3 {
		t.Fatalf("%d items pending, want 3 (the retry stores nothing)", len(items))
	}
	want := []struct {
		id, delivery string
		traced       bool
	}{{plain, store.DeliveryNextTurn, true}, {step, store.DeliveryNextStep, false}, {keyed, store.DeliveryNextTurn, false}}
	for i, w := range want {
		it := items[i]
		if it.MessageID != w.id || string(it.Delivery) != w.delivery {
			t.Fatalf("item %d = %s (%s), want %s (%s)", i, it.MessageID, it.Delivery, w.id, w.delivery)
		}
		if got := it.Trace[tracecontext.HeaderTraceparent]; w.traced != (len(got) == 1 && got[0] == traceparent) {
			t.Fatalf("item %d carries trace %v, want traced=%v", i, it.Trace, w.traced)
		}
		if got := it.Trace[tracecontext.HeaderTracestate]; w.traced != (len(got) == 1 && got[0] == tracestate) {
			t.Fatalf("item %d carries trace state %v, want traced=%v", i, it.Trace, w.traced)
		}
	}
}

// TestRemoveIsIdempotent: removing an item that is already gone (an earlier
// attempt, another claimer) is no error, and the other items stay.
func TestRemoveIsIdempotent(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	_, seq1, err := st.Enqueue(ctx, protocol.ScopeRoot, "S", store.InboxItem{Content: protocol.Text("a")}, "")
	if err != nil {
		t.Fatal(err)
	}
	id2, _, err := st.Enqueue(ctx, protocol.ScopeRoot, "S", store.InboxItem{Content: protocol.Text("b")}, "")
	if err != nil {
		t.Fatal(err)
	}
	in := st.InboxOf(protocol.ScopeRoot, "S")
	for i := 0; i < 2; i++ {
		if err := in.Remove(ctx, seq1); err != nil {
			t.Fatalf("removal %d of item %d: %v", i+1, seq1, err)
		}
	}
	items, err := in.Pending(ctx, 0)
	if err != nil || len(items) != 1 || items[0].MessageID != id2 {
		t.Fatalf("pending = %+v, %v; want only %s", items, err, id2)
	}
}

// TestAKeyedRetryOfAGivenIDAnswersTheOriginal: an item that carries its own
// messageId and an idempotency key, sent again with the same key (and a new
// messageId, as a caller retrying builds a new item), is stored once and
// answered with the original's messageId and sequence.
func TestAKeyedRetryOfAGivenIDAnswersTheOriginal(t *testing.T) {
	s := testutil.Server(t)
	st := testutil.Store(t, testutil.Connect(t, s.ClientURL()))
	ctx := context.Background()
	first, seq, err := st.Enqueue(ctx, protocol.ScopeRoot, "S", store.InboxItem{MessageID: "01ORIGINAL0000000000000000", Content: protocol.Text("a")}, "key-1")
	if err != nil || first != "01ORIGINAL0000000000000000" {
		t.Fatalf("enqueue = %s, %v", first, err)
	}
	again, seq2, err := st.Enqueue(ctx, protocol.ScopeRoot, "S", store.InboxItem{MessageID: "01RETRY000000000000000000", Content: protocol.Text("a")}, "key-1")
	if err != nil || again != first || seq2 != seq {
		t.Fatalf("retry with the same key = %s@%d, %v; want the original %s@%d", again, seq2, err, first, seq)
	}
	if items, err := st.InboxOf(protocol.ScopeRoot, "S").Pending(ctx, 0); err != nil || len(items) != 1 {
		t.Fatalf("pending = %+v, %v; want the one original", items, err)
	}
}

// TestRemoveTellsGoneFromRefused: a removal JetStream refuses because the
// message is gone (10043 from a replicated stream; 10057 "no message found"
// from a single-replica one) is done; any other refusal is an error, and
// the item stays.
func TestRemoveTellsGoneFromRefused(t *testing.T) {
	s := testutil.Server(t)
	base := testutil.Store(t, testutil.Connect(t, s.ClientURL()))
	for _, tc := range []struct {
		name string
		err  *jetstream.APIError
		gone bool
	}{
		{"sequence not found (replicated stream)", &jetstream.APIError{Code: 400, ErrorCode: 10043, Description: "sequence not found"}, true},
		{"no message found (single replica)", &jetstream.APIError{Code: 500, ErrorCode: 10057, Description: "error deleting message: no message found"}, true},
		{"another deletion failure", &jetstream.APIError{Code: 500, ErrorCode: 10057, Description: "error deleting message: store closed"}, false},
		{"another refusal", &jetstream.APIError{Code: 400, ErrorCode: 10071, Description: "wrong last sequence: 3"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The deletion is answered tc.err instead of being sent.
			st := base.WithFaults(store.Faults{Before: func(_ context.Context, w store.Write) error {
				if w.Op == store.OpMsgDelete {
					return tc.err
				}
				return nil
			}})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			session := "S" + strings.NewReplacer(" ", "", "(", "", ")", "").Replace(tc.name)
			_, seq, err := base.Enqueue(ctx, protocol.ScopeRoot, session, store.InboxItem{Content: protocol.Text("a")}, "")
			if err != nil {
				t.Fatal(err)
			}
			err = st.InboxOf(protocol.ScopeRoot, session).Remove(ctx, seq)
			if tc.gone && err != nil {
				t.Fatalf("a removal answered %v: %v, want done (the message is gone)", tc.err, err)
			}
			if !tc.gone && err == nil {
				t.Fatalf("a removal answered %v was taken as done", tc.err)
			}
		})
	}
}

// TestOnlyItemsTheLogNamesAreRemoved: store.RemoveDoneInboxItems (what a
// coordinator does for a child's host, protocol.Subjects.InboxRemove)
// deletes an item only when the session's log claims or discards it, by
// its sequence or, for a second copy, by its messageId, even when the
// claim lies further back than the first window of the log's tail; a
// request naming any item the log does not name (or made for a session whose
// log is still empty) deletes nothing, and one naming another session's item
// is INVALID_ARGUMENT. No accepted item can
// leave an inbox before its log names it (RELIABILITY.md I1), whoever asks.
func TestOnlyItemsTheLogNamesAreRemoved(t *testing.T) {
	st := testutil.NewStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := protocol.SessionHeader{Version: protocol.SessionHeaderVersion, ID: "C", ParentSession: "R", Origin: protocol.OriginSubagent, DelegationDepth: 1, Provider: "spawn"}
	if err := st.PutHeader(ctx, h); err != nil {
		t.Fatal(err)
	}
	enqueue := func(id, text string) (string, protocol.Seq) {
		t.Helper()
		msgID, seq, err := st.Enqueue(ctx, "spawn", id, store.InboxItem{Content: protocol.Text(text)}, "")
		if err != nil {
			t.Fatal(err)
		}
		return msgID, seq
	}
	claimedID, claimed := enqueue("C", "claimed")
	discardedID, discarded := enqueue("C", "discarded")
	_, pending := enqueue("C", "pending")
	_, other := enqueue("O", "another session's")
	// A second copy of the claimed item (a retry the stream stored again,
	// store.KeyedMessageID): the same messageId under a new sequence.
	data, err := protocol.Marshal(protocol.Msgpack, store.InboxItem{MessageID: claimedID, Content: protocol.Text("claimed"), Delivery: store.DeliveryNextTurn})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := st.JS.Publish(ctx, st.Subj.Inbox("spawn", "C"), data)
	if err != nil {
		t.Fatal(err)
	}
	copySeq := protocol.Seq(ack.Sequence)
	ev := func(typ string, data any) protocol.SessionEvent {
		e, err := protocol.NewEvent(typ, store.NowMs(), data)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	w := st.NewLogWriter("spawn", "C", 0, 0)
	if _, err := w.Append(ctx,
		ev(protocol.EvInboxDequeue, protocol.InboxDequeueData{MessageID: claimedID, InboxSeq: claimed, Turn: 1}),
		ev(protocol.EvInboxDiscard, protocol.InboxDiscardData{MessageID: discardedID, InboxSeq: discarded, Reason: "cancelled"}),
	); err != nil {
		t.Fatal(err)
	}
	// More of the log stream than the first tail window after the claims,
	// and a last record of C's own.
	filler := st.NewLogWriter("spawn", "F", 0, 0)
	for i := 0; i <= store.LogTailWindow; i++ {
		if _, err := filler.Append(ctx, ev(protocol.EvTurnEnd, protocol.TurnEndData{Turn: int64(i)})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Append(ctx, ev(protocol.EvTurnEnd, protocol.TurnEndData{Turn: 1})); err != nil {
		t.Fatal(err)
	}
	all := []protocol.Seq{claimed, discarded, pending, copySeq}
	for _, tc := range []struct {
		name string
		seqs []protocol.Seq
		code protocol.Code
	}{
		{"an item the log does not name, with the done ones", []protocol.Seq{claimed, discarded, pending, copySeq}, protocol.CodeUnauthorized},
		{"an item the log does not name", []protocol.Seq{pending}, protocol.CodeUnauthorized},
		{"another session's item", []protocol.Seq{claimed, other}, protocol.CodeInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := st.RemoveDoneInboxItems(ctx, h, tc.seqs)
			if protocol.CodeOf(err) != tc.code || n != 0 {
				t.Fatalf("removed %d, %v; want 0, %s", n, err, tc.code)
			}
			if got := testutil.PendingSeqs(ctx, t, st, "C"); !slices.Equal(got, all) {
				t.Fatalf("pending %v after a refused removal, want %v", got, all)
			}
		})
	}
	n, err := st.RemoveDoneInboxItems(ctx, h, []protocol.Seq{claimed, discarded, copySeq})
	if err != nil || n != 3 {
		t.Fatalf("removal of the claimed, the discarded and the copy: %d, %v; want 3", n, err)
	}
	if got := testutil.PendingSeqs(ctx, t, st, "C"); !slices.Equal(got, []protocol.Seq{pending}) {
		t.Fatalf("pending %v, want only %d", got, pending)
	}
	if n, err := st.RemoveDoneInboxItems(ctx, h, []protocol.Seq{claimed, copySeq}); err != nil || n != 0 {
		t.Fatalf("removal of items already gone: %d, %v; want 0, nil", n, err)
	}
	// A session whose log holds no record yet (its host asks before its
	// first append, or a forged request) names no item: refused.
	empty := h
	empty.ID = "E"
	_, waiting := enqueue("E", "waiting")
	if n, err := st.RemoveDoneInboxItems(ctx, empty, []protocol.Seq{waiting}); protocol.CodeOf(err) != protocol.CodeUnauthorized || n != 0 {
		t.Fatalf("removal from a session with an empty log: %d, %v; want 0, %s", n, err, protocol.CodeUnauthorized)
	}
	if items, err := st.InboxOf("spawn", "E").Pending(ctx, 0); err != nil || len(items) != 1 || items[0].Seq != waiting {
		t.Fatalf("E's inbox after a refused removal: %+v, %v; want its item %d", items, err, waiting)
	}
}

// TestAWakeUpNamesItsSessionsScopeAndCarriesNothing: an item accepted into
// a session's inbox, and an ownership edge its owner loses, wake the
// session on its header's scope's wake subject (<p>.v1.wake.<scope>.<id>),
// with an empty body: a worker's NATS user may subscribe only to its own
// provider's wake-ups and to no inbox subject (docs/security.md), so a
// wake-up on any other subject, or one carrying the item, would either
// never reach its activation or show the item to every provider's workers.
// The ownership release takes the owner's scope from its header.
func TestAWakeUpNamesItsSessionsScopeAndCarriesNothing(t *testing.T) {
	st := testutil.NewStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wakes := testutil.Subscribe(t, st.NC, st.Subj.Wake("*", "*"))
	for _, h := range []protocol.SessionHeader{
		{Version: protocol.SessionHeaderVersion, ID: "R"},
		{Version: protocol.SessionHeaderVersion, ID: "C", ParentSession: "R", Origin: protocol.OriginSubagent, DelegationDepth: 1, Provider: "spawn"},
		{Version: protocol.SessionHeaderVersion, ID: "F", ParentSession: "C", Origin: protocol.OriginSubagent, DelegationDepth: 2, Provider: "fork"},
	} {
		if err := st.PutHeader(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.AddOwnership(ctx, "C", "F"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		do   func() error
		want string
	}{
		{"an item for a spawn child", func() error {
			_, _, err := st.Enqueue(ctx, "spawn", "C", store.InboxItem{Content: protocol.Text("a secret prompt")}, "")
			return err
		}, st.Subj.Wake("spawn", "C")},
		{"an item for a fork child", func() error {
			_, _, err := st.Enqueue(ctx, "fork", "F", store.InboxItem{Content: protocol.Text("a secret prompt")}, "k")
			return err
		}, st.Subj.Wake("fork", "F")},
		{"an item for a root", func() error {
			_, _, err := st.Enqueue(ctx, protocol.ScopeRoot, "R", store.InboxItem{Content: protocol.Text("a secret prompt")}, "")
			return err
		}, st.Subj.Wake(protocol.ScopeRoot, "R")},
		{"an ownership edge released", func() error { return st.ReleaseOwnership(ctx, "C", "F") }, st.Subj.Wake("spawn", "C")},
	} {
		if err := tc.do(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		select {
		case m := <-wakes:
			if m.Subject != tc.want || len(m.Data) != 0 {
				t.Fatalf("%s: a wake-up on %s carrying %q, want %s with nothing", tc.name, m.Subject, m.Data, tc.want)
			}
		case <-ctx.Done():
			t.Fatalf("%s: no wake-up on %s", tc.name, tc.want)
		}
	}
}
