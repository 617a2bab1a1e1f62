package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Every key the layout builds is told apart by KindOf, which gives back the
// id it was built from; a bare id, or a lease key of no provider or of a
// dotted id, is no lease.
func TestKeyLayoutRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		key  string
		kind store.AgentsKind
		id   string
	}{
		{store.LeaseKey("spawn", "S1"), store.KindLease, "S1"},
		{store.LeaseKey("fork", "01J9-abc_d"), store.KindLease, "01J9-abc_d"},
		{store.RootLeaseKey("R1"), store.KindRootLease, "R1"},
		{store.LeaseKeyFor("R1", protocol.ScopeRoot), store.KindRootLease, "R1"},
		{store.LeaseKeyFor("S1", "acp"), store.KindLease, "S1"},
		{store.LeaseKeyOf(protocol.AgentRecord{SessionID: "R1", Kind: protocol.AgentRoot}), store.KindRootLease, "R1"},
		{store.LeaseKeyOf(protocol.AgentRecord{SessionID: "S1", Kind: protocol.AgentOneShot, Provider: "spawn"}), store.KindLease, "S1"},
		{"S1", store.KindOther, "S1"},
		{"lease.S1", store.KindOther, "lease.S1"},
		{"lease..S1", store.KindOther, "lease..S1"},
		{"lease.spawn.", store.KindOther, "lease.spawn."},
		{"lease.spawn.S1.x", store.KindOther, "lease.spawn.S1.x"},
		{store.OwnsKey("P"), store.KindOwnership, "P"},
		{store.SlotsKey("P"), store.KindSlots, "P"},
		{store.GrantKey("ab12"), store.KindGrant, "ab12"},
		{store.DrainKey("S1"), store.KindDrain, "S1"},
		{store.DrainKey(store.DrainAll), store.KindDrain, store.DrainAll},
		{"other.key", store.KindOther, "other.key"},
		{"", store.KindOther, ""},
	} {
		kind, id := store.KindOf(tc.key)
		if kind != tc.kind || id != tc.id {
			t.Errorf("KindOf(%q) = %v, %q; want %v, %q", tc.key, kind, id, tc.kind, tc.id)
		}
	}
	if store.LeaseKey("spawn", "S1") == store.LeaseKey("fork", "S1") || !strings.HasPrefix(store.LeaseKey("spawn", "S1"), "lease.spawn.") {
		t.Error("a child's lease key must lie under its provider's prefix, lease.<provider>.")
	}
	if store.DrainKey(store.DrainAll) == store.DrainKey("all") {
		t.Error("the global drain's key must differ from every session's drain key")
	}
}

// A child's lease is read under the provider its header names, and only
// there: a lease of the same session under another provider's prefix (what
// a worker of that provider could write) is not its lease, a session without
// a header has none, and a child's lease that names no provider is refused
// rather than written under a key of no provider.
func TestAChildsLeaseIsReadUnderItsHeadersProvider(t *testing.T) {
	s := testutil.Server(t)
	st := testutil.Store(t, testutil.Connect(t, s.ClientURL()))
	ctx := context.Background()
	if err := st.PutHeader(ctx, protocol.SessionHeader{ID: "C1", ParentSession: "P1", Provider: "fork"}); err != nil {
		t.Fatal(err)
	}
	forged := protocol.AgentRecord{SessionID: "C1", Kind: protocol.AgentContinuable, HostID: "spawn.H1", Epoch: 1, Provider: "spawn"}
	if _, err := st.CreateLease(ctx, forged); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Lease(ctx, "C1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the fork child's lease, with only a spawn-prefixed one written: %v, want ErrNotFound", err)
	}
	own := protocol.AgentRecord{SessionID: "C1", Kind: protocol.AgentContinuable, HostID: "fork.H2", Epoch: 1, Provider: "fork", ParentSession: "P1"}
	if _, err := st.CreateLease(ctx, own); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Lease(ctx, "C1"); err != nil || got.Value.HostID != "fork.H2" {
		t.Fatalf("the fork child's lease: %+v, %v; want the one under lease.fork.C1", got.Value, err)
	}
	if _, err := st.Lease(ctx, "NOHEADER"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the lease of a session without a header: %v, want ErrNotFound", err)
	}
	if _, err := st.CreateLease(ctx, protocol.AgentRecord{SessionID: "C1", Kind: protocol.AgentOneShot}); err == nil {
		t.Fatal("a child's lease without a provider was written")
	}
}

// A lease record is a session's lease only if it belongs under the key it
// was read from: it names that session, a child's kind and the header's
// provider and parent (a worker may write its own provider's leases, and
// what it writes there must not pass for another provider's child, a
// root, or a child of another parent). Every reader refuses the rest as
// ErrMisfiledLease, which is also ErrNotFound.
func TestALeaseRecordBelongsUnderItsKeyAndHeader(t *testing.T) {
	s := testutil.Server(t)
	st := testutil.Store(t, testutil.Connect(t, s.ClientURL()))
	ctx := context.Background()
	if err := st.PutHeader(ctx, protocol.SessionHeader{ID: "C1", ParentSession: "P1", Provider: "fork"}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutHeader(ctx, protocol.SessionHeader{ID: "S1", ParentSession: "P2", Provider: "spawn"}); err != nil {
		t.Fatal(err)
	}
	own := protocol.AgentRecord{SessionID: "C1", Kind: protocol.AgentContinuable, HostID: "fork.H1", Epoch: 1, Provider: "fork", ParentSession: "P1"}
	key := store.LeaseKey("fork", "C1")
	for _, tc := range []struct {
		name string
		edit func(*protocol.AgentRecord)
	}{
		{"another session's id (a spawn child's)", func(r *protocol.AgentRecord) { r.SessionID, r.ParentSession = "S1", "P2" }},
		{"another provider", func(r *protocol.AgentRecord) { r.Provider = "spawn" }},
		{"no provider", func(r *protocol.AgentRecord) { r.Provider = "" }},
		{"a root's kind", func(r *protocol.AgentRecord) { r.Kind = protocol.AgentRoot }},
		{"another parent", func(r *protocol.AgentRecord) { r.ParentSession = "VICTIM" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forged := own
			tc.edit(&forged)
			if _, err := store.Put(ctx, st.Agents, key, forged); err != nil {
				t.Fatal(err)
			}
			for name, read := range map[string]func() error{
				"Lease":            func() error { _, err := st.Lease(ctx, "C1"); return err },
				"LeaseLatest":      func() error { _, err := st.LeaseLatest(ctx, "C1"); return err },
				"LeaseBelongs":     func() error { return st.LeaseBelongs(ctx, key, forged) },
				"ChildLeaseLatest": func() error { _, err := st.ChildLeaseLatest(ctx, "fork", "C1"); return err },
			} {
				err := read()
				if name == "ChildLeaseLatest" && tc.name == "another parent" {
					// A host reads its own child's lease without a header: the
					// parent is not checked there (it wrote it).
					if err != nil {
						t.Errorf("%s: %v", name, err)
					}
					continue
				}
				if !errors.Is(err, store.ErrMisfiledLease) || !errors.Is(err, store.ErrNotFound) {
					t.Errorf("%s of a lease naming %s: %v, want ErrMisfiledLease and ErrNotFound", name, tc.name, err)
				}
			}
		})
	}
	if _, err := store.Put(ctx, st.Agents, key, own); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Lease(ctx, "C1"); err != nil || got.Value.HostID != "fork.H1" {
		t.Fatalf("its own lease: %+v, %v", got.Value, err)
	}
	if err := st.LeaseBelongs(ctx, key, own); err != nil {
		t.Fatalf("its own lease does not belong: %v", err)
	}
	other := own
	other.Provider = "spawn"
	if err := st.LeaseBelongs(ctx, store.LeaseKey("spawn", "C1"), other); !errors.Is(err, store.ErrMisfiledLease) {
		t.Fatalf("a lease under a spawn worker's key for the fork child: %v, want ErrMisfiledLease", err)
	}
	ghost := protocol.AgentRecord{SessionID: "NOHEADER", Kind: protocol.AgentOneShot, HostID: "fork.H1", Epoch: 1, Provider: "fork", ParentSession: "P1"}
	if err := st.LeaseBelongs(ctx, store.LeaseKey("fork", "NOHEADER"), ghost); !errors.Is(err, store.ErrMisfiledLease) {
		t.Fatalf("a lease of a session without a header: %v, want ErrMisfiledLease", err)
	}
}
