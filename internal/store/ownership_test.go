package store_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestOwnershipUpdatesRacingLoseNothing: many children register with one
// parent at once, each through its own connection (hosts and coordinators
// do), then half of them release at once. Each update is a compare-and-set
// retried on conflict (docs/design.md §7, Ownership), so the record ends with
// exactly the children still owned: a lost update would leave a parent
// waiting for a child that ended, or forget one it still owns.
func TestOwnershipUpdatesRacingLoseNothing(t *testing.T) {
	s := testutil.Server(t)
	base := testutil.Store(t, testutil.Connect(t, s.ClientURL()))
	const parent, children = "OWNER", 12
	stores := make([]*store.Store, children)
	for i := range stores {
		st, err := store.Bind(context.Background(), testutil.Connect(t, s.ClientURL()), base.Subj)
		if err != nil {
			t.Fatal(err)
		}
		stores[i] = st
	}
	ctx := context.Background()
	if err := base.PutHeader(ctx, protocol.SessionHeader{Version: protocol.SessionHeaderVersion, ID: parent, ParentSession: "ROOT",
		Origin: protocol.OriginSubagent, DelegationDepth: 1, Provider: "spawn"}); err != nil {
		t.Fatal(err)
	}
	all := func(do func(st *store.Store, child string) error, which func(i int) bool) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, children)
		for i := range children {
			if !which(i) {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = do(stores[i], fmt.Sprintf("child-%02d", i))
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("child-%02d: %v", i, err)
			}
		}
	}
	owned := func() []string {
		t.Helper()
		r, err := base.Ownership(ctx, parent)
		if err != nil {
			t.Fatalf("read the ownership record: %v", err)
		}
		out := slices.Clone(r.Value.Children)
		slices.Sort(out)
		return out
	}
	register := func(st *store.Store, child string) error { return st.AddOwnership(ctx, parent, child) }
	release := func(st *store.Store, child string) error { return st.RemoveOwnership(ctx, parent, child) }
	every := func(int) bool { return true }
	odd := func(i int) bool { return i%2 == 1 }

	all(register, every)
	var want []string
	for i := range children {
		want = append(want, fmt.Sprintf("child-%02d", i))
	}
	if got := owned(); !slices.Equal(got, want) {
		t.Fatalf("owned after concurrent registrations = %v, want %v", got, want)
	}
	all(register, every) // idempotent
	if got := owned(); !slices.Equal(got, want) {
		t.Fatalf("owned after registering again = %v, want %v", got, want)
	}
	all(release, odd)
	var even []string
	for i := 0; i < children; i += 2 {
		even = append(even, fmt.Sprintf("child-%02d", i))
	}
	if got := owned(); !slices.Equal(got, even) {
		t.Fatalf("owned after concurrent releases = %v, want %v", got, even)
	}
	all(release, every)
	if _, err := base.Ownership(ctx, parent); err != store.ErrNotFound {
		t.Fatalf("the record of a parent that owns nothing: %v, want it deleted", err)
	}
}
