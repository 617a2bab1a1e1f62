package coordinator

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// entry is a KV entry as a watch delivers it.
type entry = testutil.KVEntry

// TestChildrenOfFollowsTheLeases: the per-parent index of the lease cache
// (agentIndex.childrenOf, which admission counts live children with) holds
// exactly the cached leases naming each parent after every put, update,
// fresher direct read (observe) and delete, as a scan of every lease finds
// them.
func TestChildrenOfFollowsTheLeases(t *testing.T) {
	a := newAgentIndex(func() time.Duration { return 0 }, nil, slog.New(slog.DiscardHandler))
	lease := func(id, parent string, rev uint64) entry {
		t.Helper()
		data, err := protocol.Marshal(protocol.Msgpack, protocol.AgentRecord{SessionID: id, ParentSession: parent, Kind: protocol.AgentContinuable, Provider: "spawn"})
		if err != nil {
			t.Fatal(err)
		}
		return entry{Name: store.LeaseKey("spawn", id), Data: data, Rev: rev}
	}
	scan := func(parent string) []string {
		var ids []string
		for _, l := range a.snapshot() {
			if l.rec.ParentSession == parent {
				ids = append(ids, l.rec.SessionID)
			}
		}
		sort.Strings(ids)
		return ids
	}
	indexed := func(parent string) []string {
		var ids []string
		for _, l := range a.childrenOf(parent) {
			ids = append(ids, l.rec.SessionID)
		}
		sort.Strings(ids)
		return ids
	}
	steps := []struct {
		name string
		do   func()
		want map[string][]string
	}{
		{"puts", func() {
			for _, e := range []entry{lease("c1", "p1", 1), lease("c2", "p1", 2), lease("c3", "p2", 3)} {
				a.put(e.Name, e)
			}
		}, map[string][]string{"p1": {"c1", "c2"}, "p2": {"c3"}}},
		{"an update of a lease", func() { e := lease("c1", "p1", 4); a.put(e.Name, e) }, map[string][]string{"p1": {"c1", "c2"}, "p2": {"c3"}}},
		{"a lease under another parent", func() { e := lease("c2", "p2", 5); a.put(e.Name, e) }, map[string][]string{"p1": {"c1"}, "p2": {"c2", "c3"}}},
		{"a fresher direct read", func() {
			a.observe(protocol.AgentRecord{SessionID: "c4", ParentSession: "p1", Kind: protocol.AgentOneShot, Provider: "spawn"}, 6)
		}, map[string][]string{"p1": {"c1", "c4"}, "p2": {"c2", "c3"}}},
		{"an older direct read changes nothing", func() {
			a.observe(protocol.AgentRecord{SessionID: "c4", ParentSession: "p2", Kind: protocol.AgentOneShot, Provider: "spawn"}, 1)
		}, map[string][]string{"p1": {"c1", "c4"}, "p2": {"c2", "c3"}}},
		{"deletes", func() {
			a.del(store.LeaseKey("spawn", "c1"))
			a.del(store.LeaseKey("spawn", "c3"))
			a.del(store.LeaseKey("spawn", "unknown"))
		}, map[string][]string{"p1": {"c4"}, "p2": {"c2"}}},
		{"the last child of a parent", func() { a.del(store.LeaseKey("spawn", "c4")) }, map[string][]string{"p1": nil, "p2": {"c2"}}},
	}
	for _, st := range steps {
		st.do()
		for parent, want := range st.want {
			if got, scanned := indexed(parent), scan(parent); strings.Join(got, ",") != strings.Join(want, ",") || strings.Join(scanned, ",") != strings.Join(want, ",") {
				t.Fatalf("%s: children of %s indexed %v, scanned %v; want %v", st.name, parent, got, scanned, want)
			}
		}
	}
	if _, ok := a.byParent["p1"]; ok {
		t.Fatal("a parent without children keeps an index entry")
	}
}

// TestALeaseReadThatRacedItsDeleteStaysGone: a direct read of a lease
// (authorize's Store.Lease, answered by a follower that has not applied
// the delete yet, or just before it) that reaches observe after the watch
// applied the delete does not put the lease back: nothing would remove it
// again, and its child would look resident for good (followups to it not
// resumed, the liveness sweep skipping it; chaos seed 4's L1). A lease put
// again, or read at a later revision (a new epoch), is cached; a delete
// of the coordinator's own (a fresh read forced) leaves no mark.
func TestALeaseReadThatRacedItsDeleteStaysGone(t *testing.T) {
	a := newAgentIndex(func() time.Duration { return 0 }, nil, slog.New(slog.DiscardHandler))
	rec := func(host string) protocol.AgentRecord {
		return protocol.AgentRecord{SessionID: "c1", ParentSession: "p1", Kind: protocol.AgentContinuable, Provider: "spawn", HostID: host}
	}
	put := func(r protocol.AgentRecord, rev uint64) {
		t.Helper()
		data, err := protocol.Marshal(protocol.Msgpack, r)
		if err != nil {
			t.Fatal(err)
		}
		e := entry{Name: store.LeaseKeyOf(r), Data: data, Rev: rev}
		a.put(e.Name, e)
	}
	cached := func() string {
		if l, ok := a.get("c1", "spawn"); ok {
			return l.rec.HostID
		}
		return ""
	}
	key := store.LeaseKey("spawn", "c1")
	steps := []struct {
		name string
		do   func()
		want string // the cached lease's host, "" none
	}{
		{"the epoch's lease put", func() { put(rec("h1"), 5) }, "h1"},
		{"the watch applies its delete", func() { a.deleted(key) }, ""},
		{"a read of it that raced the delete", func() { a.observe(rec("h1"), 5) }, ""},
		{"an older read", func() { a.observe(rec("h1"), 3) }, ""},
		{"a new epoch's lease read before the watch puts it", func() { a.observe(rec("h2"), 9) }, "h2"},
		{"the watch puts it", func() { put(rec("h2"), 9) }, "h2"},
		{"the watch applies its delete", func() { a.deleted(key) }, ""},
		{"a third epoch's lease put", func() { put(rec("h3"), 12) }, "h3"},
		{"the coordinator forces a fresh read", func() { a.del(key) }, ""},
		{"which reads the same lease", func() { a.observe(rec("h3"), 12) }, "h3"},
	}
	for _, st := range steps {
		st.do()
		if got := cached(); got != st.want {
			t.Fatalf("%s: cached lease on %q, want %q", st.name, got, st.want)
		}
	}
}

// TestALeaseOnlyReadIsNotTrustedForLong: a lease a direct read put in the
// index (observe) that the watch does not deliver within
// observedLeaseTrust is dropped, not taken as live for good: the watch
// may have missed its put and its delete while it was opened again (chaos
// seed 3). One the watch delivered is kept however old.
func TestALeaseOnlyReadIsNotTrustedForLong(t *testing.T) {
	a := newAgentIndex(func() time.Duration { return 0 }, nil, slog.New(slog.DiscardHandler))
	now := time.Unix(1000, 0)
	a.now = func() time.Time { return now }
	rec := func(id string) protocol.AgentRecord {
		return protocol.AgentRecord{SessionID: id, ParentSession: "p1", Kind: protocol.AgentContinuable, Provider: "spawn", HostID: "h1"}
	}
	a.observe(rec("read"), 5)
	data, err := protocol.Marshal(protocol.Msgpack, rec("watched"))
	if err != nil {
		t.Fatal(err)
	}
	e := entry{Name: store.LeaseKey("spawn", "watched"), Data: data, Rev: 6}
	a.put(e.Name, e)
	a.observe(rec("confirmed"), 7)
	data, err = protocol.Marshal(protocol.Msgpack, rec("confirmed"))
	if err != nil {
		t.Fatal(err)
	}
	e = entry{Name: store.LeaseKey("spawn", "confirmed"), Data: data, Rev: 7}
	a.put(e.Name, e)
	for _, step := range []struct {
		after time.Duration
		want  map[string]bool
	}{
		{0, map[string]bool{"read": true, "watched": true, "confirmed": true}},
		{observedLeaseTrust, map[string]bool{"read": true, "watched": true, "confirmed": true}},
		{observedLeaseTrust + time.Millisecond, map[string]bool{"read": false, "watched": true, "confirmed": true}},
		{time.Hour, map[string]bool{"read": false, "watched": true, "confirmed": true}},
	} {
		now = time.Unix(1000, 0).Add(step.after)
		for id, want := range step.want {
			if _, ok := a.get(id, "spawn"); ok != want {
				t.Errorf("after %s: lease of %s cached %v, want %v", step.after, id, ok, want)
			}
		}
	}
	if n := len(a.childrenOf("p1")); n != 2 {
		t.Errorf("p1 has %d children indexed, want 2 (the dropped lease unindexed)", n)
	}
}

// TestTheLeaseIndexKeepsOnlyLeasesTheirHeaderOwns: a worker may write its
// own provider's leases (lease.<provider>.>), and the coordinator's lease
// index takes what it writes there only when the session's header (which
// only coordinators write) agrees: the same provider and the same parent.
// A lease under a provider's key for another provider's child, one naming
// a parent its header does not (counted against that parent's live
// children, disposed with its tree), or one of no session is no lease: it
// is neither found nor listed.
func TestTheLeaseIndexKeepsOnlyLeasesTheirHeaderOwns(t *testing.T) {
	srv := testutil.Server(t)
	st := testutil.Store(t, testutil.Connect(t, srv.ClientURL()))
	ctx := context.Background()
	if err := st.PutHeader(ctx, protocol.SessionHeader{ID: "C1", ParentSession: "P1", Provider: "fork"}); err != nil {
		t.Fatal(err)
	}
	a := newAgentIndex(func() time.Duration { return 0 }, func(key string, rec protocol.AgentRecord) error {
		return st.LeaseBelongs(ctx, key, rec)
	}, slog.Default())
	put := putRecords[protocol.AgentRecord](t, a.put)
	listed := func() []string {
		var keys []string
		for _, l := range a.snapshot() {
			keys = append(keys, store.LeaseKeyOf(l.rec)+" parent "+l.rec.ParentSession)
		}
		sort.Strings(keys)
		return keys
	}
	own := protocol.AgentRecord{SessionID: "C1", Kind: protocol.AgentContinuable, HostID: "fork.H1", Epoch: 1, Provider: "fork", ParentSession: "P1"}
	forged := own
	forged.Provider, forged.HostID = "spawn", "spawn.H2"
	put(store.LeaseKey("spawn", "C1"), forged) // a spawn worker's, for a fork child
	orphan := own
	orphan.SessionID = "NOHEADER"
	put(store.LeaseKey("fork", "NOHEADER"), orphan)
	if got := listed(); len(got) != 0 {
		t.Fatalf("the index holds %v; want no lease: a lease for another provider's child, and one of no session", got)
	}
	put(store.LeaseKey("fork", "C1"), own)
	if l, ok := a.get("C1", "fork"); !ok || l.rec.HostID != "fork.H1" {
		t.Fatalf("the fork child's own lease: %+v, %v", l.rec, ok)
	}
	renewed := own
	renewed.Epoch = 2
	put(store.LeaseKey("fork", "C1"), renewed)
	if got := listed(); len(got) != 1 || got[0] != "lease.fork.C1 parent P1" {
		t.Fatalf("the index holds %v; want the fork child's lease, renewed", got)
	}
	victim := own
	victim.ParentSession = "VICTIM"
	put(store.LeaseKey("fork", "C1"), victim)
	if got := listed(); len(got) != 0 {
		t.Fatalf("the index holds %v after the lease was rewritten naming another parent; want none", got)
	}
	if _, ok := a.get("C1", "fork"); ok {
		t.Fatal("a lease naming a parent its header does not is still found")
	}
}

// putRecords returns a function that files rec under key in an index (its
// put, as a KV watch would deliver it), msgpack-encoded at the next
// revision.
func putRecords[R any](t *testing.T, put func(string, jetstream.KeyValueEntry) time.Duration) func(key string, rec R) {
	rev := uint64(0)
	return func(key string, rec R) {
		t.Helper()
		data, err := protocol.Marshal(protocol.Msgpack, rec)
		if err != nil {
			t.Fatal(err)
		}
		rev++
		put(key, entry{Name: key, Data: data, Rev: rev})
	}
}
