package store_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
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
		{store.OwnsKey("spawn", "P"), store.KindOwnership, "P"},
		{store.OwnsKey(protocol.ScopeRoot, "R1"), store.KindOwnership, "R1"},
		{"owns.P", store.KindOther, "owns.P"},
		{"owns.spawn.P.x", store.KindOther, "owns.spawn.P.x"},
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
	if store.OwnsKey("spawn", "P") == store.OwnsKey("fork", "P") || !strings.HasPrefix(store.OwnsKey("spawn", "P"), "owns.spawn.") {
		t.Error("an ownership record's key must lie under its parent's scope's prefix, owns.<scope>.")
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

// A lease is written only under a key of the layout (leaseKeyable): a
// root's lease names its session and no provider (root.<id>), a child's its
// session and its provider, each one key token (lease.<provider>.<id>).
// CreateLease and UpdateLease refuse a child's lease that names no provider
// and one whose provider or session id would spread over several tokens
// (lease.fork.x.C1, a key of no session's lease), and write nothing.
func TestALeaseIsWrittenOnlyUnderAKeyOfTheLayout(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	root := protocol.AgentRecord{SessionID: "R1", Kind: protocol.AgentRoot, HostID: "coordinator-1", Epoch: 1}
	rev, err := st.CreateLease(ctx, root)
	if err != nil {
		t.Fatalf("a root's lease, which names no provider: %v", err)
	}
	root.Epoch = 2
	if _, err := st.UpdateLease(ctx, root, rev); err != nil {
		t.Fatalf("a root's lease renewed: %v", err)
	}
	if got, err := store.Get[protocol.AgentRecord](ctx, st.Agents, store.RootLeaseKey("R1")); err != nil || got.Value.Epoch != 2 {
		t.Fatalf("the root's lease under %s: %+v, %v; want epoch 2", store.RootLeaseKey("R1"), got.Value, err)
	}
	for _, tc := range []struct {
		name string
		rec  protocol.AgentRecord
		key  string // where the record would land were it written ("": no valid key)
	}{
		{"a one-shot child naming no provider", protocol.AgentRecord{SessionID: "C1", Kind: protocol.AgentOneShot, HostID: "spawn.H1", Epoch: 1}, ""},
		{"a continuable child naming no provider", protocol.AgentRecord{SessionID: "C1", Kind: protocol.AgentContinuable, HostID: "spawn.H1", Epoch: 1}, ""},
		{"a child whose provider spans two tokens", protocol.AgentRecord{SessionID: "C1", Kind: protocol.AgentContinuable, HostID: "fork.H1", Epoch: 1, Provider: "fork.x"}, "lease.fork.x.C1"},
		{"a child whose session id spans two tokens", protocol.AgentRecord{SessionID: "C.1", Kind: protocol.AgentOneShot, HostID: "fork.H1", Epoch: 1, Provider: "fork"}, "lease.fork.C.1"},
		{"a root whose session id spans two tokens", protocol.AgentRecord{SessionID: "R.1", Kind: protocol.AgentRoot, HostID: "coordinator-1", Epoch: 1}, "root.R.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := st.CreateLease(ctx, tc.rec); err == nil {
				t.Error("CreateLease wrote it")
			}
			if _, err := st.UpdateLease(ctx, tc.rec, 1); err == nil {
				t.Error("UpdateLease wrote it")
			}
			if tc.key == "" {
				return
			}
			if got, err := store.Get[protocol.AgentRecord](ctx, st.Agents, tc.key); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("under %s: %+v, %v; want nothing written", tc.key, got.Value, err)
			}
		})
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

// A run is its spec (spec.<runId>, which only coordinators write) joined
// with its state read under the provider the spec names
// (state.<provider>.<runId>, which only that provider's workers and
// coordinators write): a state another provider's worker writes under its
// own prefix for the run is never read, and what the coordinator decided
// (child, parent, notify subject, provider, mode) comes from the spec even
// when the run's own provider rewrites its state.
func TestARunsStateIsReadUnderItsSpecsProvider(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	spec, rev := createForkRun(t, st)
	forged := store.Settled(spec, "spawn.forger", protocol.SubagentResult{Output: protocol.Text("forged"), StopReason: protocol.StopCompleted})
	forged.Provider = "spawn"
	if _, err := store.Put(ctx, st.Runs, store.RunStateKey("spawn", "R1"), forged); err != nil {
		t.Fatal(err)
	}
	for name, read := range map[string]func(context.Context, string) (store.Record[protocol.RunRecord], error){"Run": st.Run, "RunLatest": st.RunLatest} {
		got, err := read(ctx, "R1")
		if err != nil || got.Value.State != protocol.RunRunning || got.Value.Result != nil || got.Revision != rev {
			t.Fatalf("%s after a spawn-prefixed settlement of a fork run: %+v at %d, %v; want it running at %d", name, got.Value, got.Revision, err, rev)
		}
	}
	// Its own provider's state, rewritten with other decisions than the
	// coordinator's: only the claim and settlement are taken from it.
	own := store.Settled(spec, "fork.H1", protocol.SubagentResult{Output: protocol.Text("done"), StopReason: protocol.StopCompleted})
	own.ChildID, own.ParentSession, own.Notify, own.Mode = "OTHER", "VICTIM", "_INBOX.worker-fork.stolen", protocol.ModeContinuable
	if won, err := st.SettleRun(ctx, own, rev); err != nil || !won {
		t.Fatalf("settle: %v, %v", won, err)
	}
	got, err := st.RunLatest(ctx, "R1")
	if err != nil {
		t.Fatal(err)
	}
	want := spec
	want.State, want.SettledAt, want.SettledBy, want.Result = protocol.RunSettled, own.SettledAt, "fork.H1", own.Result
	if got.Value.ChildID != "C1" || got.Value.ParentSession != "P1" || got.Value.Notify != spec.Notify || got.Value.Mode != protocol.ModeOneShot ||
		got.Value.State != protocol.RunSettled || got.Value.SettledBy != "fork.H1" || protocol.PlainText(got.Value.Result.Output) != "done" {
		t.Fatalf("the run: %+v; want the spec's decisions with the state's settlement (%+v)", got.Value, want)
	}
	for _, id := range []string{"NOSPEC", "", "a.b"} {
		if _, err := st.Run(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a run %q without a spec: %v, want ErrNotFound", id, err)
		}
	}
	if _, err := st.CreateRun(ctx, spec); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a second spec of R1: %v, want ErrConflict", err)
	}
	for _, tc := range []struct {
		key      string
		kind     store.RunsKind
		provider string
		runID    string
	}{
		{store.RunSpecKey("fork", "R1"), store.RunsSpec, "fork", "R1"},
		{store.RunStateKey("fork", "R1"), store.RunsState, "fork", "R1"},
		{"R1", store.RunsOther, "", "R1"},
		{"state.R1", store.RunsOther, "", "state.R1"},
		{"spec.R1", store.RunsOther, "", "spec.R1"},
		{"spec.fork.R1.x", store.RunsOther, "", "spec.fork.R1.x"},
	} {
		if kind, p, id := store.RunsKindOf(tc.key); kind != tc.kind || p != tc.provider || id != tc.runID {
			t.Errorf("RunsKindOf(%q) = %v, %q, %q; want %v, %q, %q", tc.key, kind, p, id, tc.kind, tc.provider, tc.runID)
		}
	}
}

// A run's spec lies under its provider (spec.<provider>.<runId>), so a
// provider's workers can be let read their own runs' specs only
// (docs/security.md, "What comes next", item 3): a coordinator finds a spec
// by the run id alone (a direct get of spec.*.<runId>, and from the
// bucket's leader before it answers ErrNotFound), a worker's read under
// another provider than the spec's finds nothing, and a record under a
// spec key that names another provider or run is no spec.
func TestARunsSpecLiesUnderItsProvider(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	spec, rev := createForkRun(t, st)
	if _, err := store.Get[protocol.RunRecord](ctx, st.Runs, "spec.fork.R1"); err != nil {
		t.Fatalf("the spec under spec.fork.R1: %v", err)
	}
	// A store that has cached no spec reads each one from the bucket.
	var leaderReads []string
	var mu sync.Mutex
	fresh := func() *store.Store {
		s, err := store.Bind(ctx, st.NC, st.Subj)
		if err != nil {
			t.Fatal(err)
		}
		return s.WithFaults(store.Faults{LeaderRead: func(_ context.Context, bucket, key string) error {
			mu.Lock()
			defer mu.Unlock()
			leaderReads = append(leaderReads, key)
			return nil
		}})
	}
	if got, err := fresh().RunSpec(ctx, "R1"); err != nil || got.ChildID != "C1" || got.Provider != "fork" {
		t.Fatalf("RunSpec by the run id alone: %+v, %v", got, err)
	}
	if got, err := fresh().Run(ctx, "R1"); err != nil || got.Revision != rev || got.Value.Notify != spec.Notify {
		t.Fatalf("Run by the run id alone: %+v at %d, %v; want it at %d", got.Value, got.Revision, err, rev)
	}
	for name, read := range map[string]func(context.Context, string, string) (store.Record[protocol.RunRecord], error){
		"RunOf": fresh().RunOf, "RunLatestOf": fresh().RunLatestOf,
	} {
		if got, err := read(ctx, "fork", "R1"); err != nil || got.Revision != rev || got.Value.ChildID != "C1" {
			t.Fatalf("%s under its own provider: %+v at %d, %v", name, got.Value, got.Revision, err)
		}
		if got, err := read(ctx, "spawn", "R1"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s under another provider: %+v, %v; want ErrNotFound", name, got.Value, err)
		}
	}
	cached := fresh()
	if _, err := cached.RunSpec(ctx, "R1"); err != nil {
		t.Fatal(err)
	}
	if _, err := cached.RunOf(ctx, "spawn", "R1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("RunOf under another provider than a cached spec's: %v; want ErrNotFound", err)
	}
	// A missing spec is asked of the leader by the pattern before it is
	// ErrNotFound; the leader answers the pattern's last match.
	mu.Lock()
	leaderReads = nil
	mu.Unlock()
	if _, err := fresh().RunSpec(ctx, "NOSPEC"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a run without a spec: %v, want ErrNotFound", err)
	}
	mu.Lock()
	if !slices.Equal(leaderReads, []string{"spec.*.NOSPEC"}) {
		t.Errorf("leader reads of a missing spec: %q; want the pattern spec.*.NOSPEC", leaderReads)
	}
	mu.Unlock()
	resp, err := st.NC.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.KV_"+st.Subj.BucketRuns(), []byte(`{"last_by_subj":"$KV.`+st.Subj.BucketRuns()+`.spec.*.R1"}`))
	if err != nil || !strings.Contains(string(resp.Data), `"subject":"$KV.`+st.Subj.BucketRuns()+`.spec.fork.R1"`) {
		t.Fatalf("a leader get of the pattern spec.*.R1 answered %s, %v; want the spec under spec.fork.R1", resp.Data, err)
	}
	// Only coordinators write specs; still, a record under a spec key that
	// names another provider or run is not that run's spec.
	misfiled := spec
	misfiled.RunID, misfiled.Provider = "R2", "fork"
	if _, err := store.Put(ctx, st.Runs, store.RunSpecKey("spawn", "R2"), misfiled); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Put(ctx, st.Runs, store.RunSpecKey("spawn", "R3"), misfiled); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"R2", "R3"} {
		if got, err := fresh().RunSpec(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a misfiled spec of %s: %+v, %v; want ErrNotFound", id, got, err)
		}
	}
}

// An ownership record lies under its parent's scope
// (owns.<scope>.<parentSession>), which the parent's header names: a
// coordinator's reads and writes find it by the parent's id, and a worker
// reads its own child's record under its own scope only.
func TestAnOwnershipRecordLiesUnderItsParentsScope(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	for _, h := range []protocol.SessionHeader{
		{Version: protocol.SessionHeaderVersion, ID: "R"},
		{Version: protocol.SessionHeaderVersion, ID: "C", ParentSession: "R", Origin: protocol.OriginSubagent, DelegationDepth: 1, Provider: "fork"},
	} {
		if err := st.PutHeader(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	for parent, scope := range map[string]string{"R": protocol.ScopeRoot, "C": "fork"} {
		if err := st.AddOwnership(ctx, parent, "F"); err != nil {
			t.Fatal(err)
		}
		if rec, err := store.Get[protocol.OwnershipRecord](ctx, st.Agents, "owns."+scope+"."+parent); err != nil || !slices.Equal(rec.Value.Children, []string{"F"}) {
			t.Fatalf("the record of %s under owns.%s.%s: %+v, %v", parent, scope, parent, rec.Value, err)
		}
		if rec, err := st.Ownership(ctx, parent); err != nil || !slices.Equal(rec.Value.Children, []string{"F"}) {
			t.Fatalf("Ownership(%s): %+v, %v", parent, rec.Value, err)
		}
	}
	if rec, err := st.OwnershipLatestOf(ctx, "fork", "C"); err != nil || !slices.Equal(rec.Value.Children, []string{"F"}) {
		t.Fatalf("OwnershipLatestOf its own scope: %+v, %v", rec.Value, err)
	}
	if rec, err := st.OwnershipLatestOf(ctx, "spawn", "C"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("OwnershipLatestOf another scope: %+v, %v; want ErrNotFound", rec.Value, err)
	}
	if err := st.RemoveOwnership(ctx, "C", "F"); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Get[protocol.OwnershipRecord](ctx, st.Agents, store.OwnsKey("fork", "C")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the emptied record: %v; want it deleted", err)
	}
	if err := st.AddOwnership(ctx, "NOHEADER", "F"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an edge of a parent with no header: %v; want ErrNotFound", err)
	}
}

// createForkRun creates the one-shot run R1 of the fork provider (child C1
// of P1) in st and returns its spec and the spec's revision.
func createForkRun(t *testing.T, st *store.Store) (protocol.RunRecord, uint64) {
	t.Helper()
	spec := protocol.RunRecord{RunID: "R1", ChildID: "C1", ParentSession: "P1", Provider: "fork", Mode: protocol.ModeOneShot,
		Notify: "_INBOX.client.n1", State: protocol.RunRunning, CreatedAt: 1}
	rev, err := st.CreateRun(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return spec, rev
}
