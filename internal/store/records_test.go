package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestCompareAndSetsRefuseAStaleRevision: an update or a conditional delete
// at a revision the key moved past is ErrConflict and changes nothing; a
// create of an existing key is ErrConflict; the current revision wins
// (docs/design.md §7: every settlement and ownership step is one of these).
func TestCompareAndSetsRefuseAStaleRevision(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	v := func(c string) protocol.OwnershipRecord { return protocol.OwnershipRecord{Children: []string{c}} }
	rev1, err := store.Create(ctx, st.Agents, "k", v("a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Create(ctx, st.Agents, "k", v("b")); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("create of an existing key: %v, want ErrConflict", err)
	}
	rev2, err := store.Update(ctx, st.Agents, "k", v("b"), rev1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Update(ctx, st.Agents, "k", v("c"), rev1); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("update at a stale revision: %v, want ErrConflict", err)
	}
	if err := store.Delete(ctx, st.Agents, "k", rev1); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("delete at a stale revision: %v, want ErrConflict", err)
	}
	got, err := store.Get[protocol.OwnershipRecord](ctx, st.Agents, "k")
	if err != nil || got.Revision != rev2 || got.Value.Children[0] != "b" {
		t.Fatalf("after the refused writes: %+v, %v; want b at revision %d", got, err, rev2)
	}
	if err := store.Delete(ctx, st.Agents, "k", rev2); err != nil {
		t.Fatalf("delete at the current revision: %v", err)
	}
	if _, err := store.Get[protocol.OwnershipRecord](ctx, st.Agents, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after the delete: %v, want ErrNotFound", err)
	}
}

// TestCompareAndSetsWhoseAnswerWasLost: a create, update or conditional
// delete lands but its answer is lost (a timeout); the store asks again,
// is refused (the write already happened) and reads the key: its own
// value there, or the key gone, means the write landed, so the caller gets
// success with the right revision rather than a conflict it would take for
// a lost race (internal/store/retry.go).
func TestCompareAndSetsWhoseAnswerWasLost(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	var mu sync.Mutex
	lose := map[store.WriteOp]bool{store.OpKVCreate: true, store.OpKVUpdate: true, store.OpKVDelete: true}
	lost := 0
	f := st.WithFaults(store.Faults{After: func(_ context.Context, w store.Write, err error) error {
		mu.Lock()
		defer mu.Unlock()
		if err == nil && lose[w.Op] {
			lose[w.Op] = false // once each
			lost++
			return nats.ErrTimeout
		}
		return err
	}})
	v := func(c string) protocol.OwnershipRecord { return protocol.OwnershipRecord{Children: []string{c}} }
	rev1, err := store.Create(ctx, f.Agents, "k", v("a"))
	if err != nil {
		t.Fatalf("create whose answer was lost: %v", err)
	}
	if got, err := store.Get[protocol.OwnershipRecord](ctx, st.Agents, "k"); err != nil || got.Revision != rev1 {
		t.Fatalf("create answered revision %d, the key is at %+v (%v)", rev1, got, err)
	}
	rev2, err := store.Update(ctx, f.Agents, "k", v("b"), rev1)
	if err != nil {
		t.Fatalf("update whose answer was lost: %v", err)
	}
	if got, err := store.Get[protocol.OwnershipRecord](ctx, st.Agents, "k"); err != nil || got.Revision != rev2 || got.Value.Children[0] != "b" {
		t.Fatalf("update answered revision %d, the key is at %+v (%v)", rev2, got, err)
	}
	if err := store.Delete(ctx, f.Agents, "k", rev2); err != nil {
		t.Fatalf("delete whose answer was lost: %v", err)
	}
	if _, err := store.Get[protocol.OwnershipRecord](ctx, st.Agents, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after the delete: %v, want ErrNotFound", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if lost != 3 {
		t.Fatalf("%d answers lost, want 3: the test did not reach its faults", lost)
	}
}
