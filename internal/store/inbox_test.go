package store_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
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
	ctx := tracecontext.Extract(context.Background(), nats.Header{tracecontext.HeaderTraceparent: {traceparent}})

	plain, _, err := st.Enqueue(ctx, "S", store.InboxItem{Content: protocol.Text("a")}, "")
	if err != nil {
		t.Fatal(err)
	}
	step, _, err := st.Enqueue(context.Background(), "S", store.InboxItem{Content: protocol.Text("b"), Delivery: store.DeliveryNextStep}, "")
	if err != nil {
		t.Fatal(err)
	}
	keyed, seq, err := st.Enqueue(context.Background(), "S", store.InboxItem{Content: protocol.Text("c")}, "key-1")
	if err != nil {
		t.Fatal(err)
	}
	again, seq2, err := st.Enqueue(context.Background(), "S", store.InboxItem{Content: protocol.Text("c")}, "key-1")
	if err != nil || again != keyed || seq2 != seq {
		t.Fatalf("retry with the same key = %s@%d, %v; want the original %s@%d", again, seq2, err, keyed, seq)
	}
	items, err := st.InboxOf("S").Pending(context.Background(), 0)
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
	}
}

// TestRemoveIsIdempotent: removing an item that is already gone (an earlier
// attempt, another claimer) is no error, and the other items stay.
func TestRemoveIsIdempotent(t *testing.T) {
	s := testutil.Server(t)
	st := testutil.Store(t, testutil.Connect(t, s.ClientURL()))
	ctx := context.Background()
	_, seq1, err := st.Enqueue(ctx, "S", store.InboxItem{Content: protocol.Text("a")}, "")
	if err != nil {
		t.Fatal(err)
	}
	id2, _, err := st.Enqueue(ctx, "S", store.InboxItem{Content: protocol.Text("b")}, "")
	if err != nil {
		t.Fatal(err)
	}
	in := st.InboxOf("S")
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
