package runindex

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// entry is a KV entry as a watch delivers it.
type entry = testutil.KVEntry

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

// TestTheRunIndexReadsAStateOnlyUnderItsSpecsProvider: the coordinators'
// index of running runs (which the orphan sweep settles) joins each run's
// spec, which only coordinators write, with its state under the provider
// the spec names: a state another provider's worker wrote under its own
// prefix is no run's, and the decisions (child, parent, notify) are the
// spec's.
func TestTheRunIndexReadsAStateOnlyUnderItsSpecsProvider(t *testing.T) {
	x := New(func() time.Duration { return 0 }, time.Minute)
	put := putRecords[protocol.RunRecord](t, x.Put)
	running := func() map[string]protocol.RunRecord {
		x.mu.Lock()
		defer x.mu.Unlock()
		out := map[string]protocol.RunRecord{}
		for id, s := range x.m {
			out[id] = s.rec
		}
		return out
	}
	spec := protocol.RunRecord{RunID: "R1", ChildID: "C1", ParentSession: "P1", Provider: "fork", Mode: protocol.ModeOneShot,
		Notify: "_INBOX.client.n", State: protocol.RunRunning}
	put(store.RunSpecKey(spec.Provider, "R1"), spec)
	forged := spec
	forged.Provider, forged.ChildID = "spawn", "VICTIM"
	put(store.RunStateKey("spawn", "R1"), forged)
	put(store.RunStateKey("spawn", "NOSPEC"), protocol.RunRecord{RunID: "NOSPEC", Provider: "spawn", State: protocol.RunRunning})
	// The spec stands for its run's state until a state under its own
	// provider arrives (they are created at once): running, unclaimed.
	if got := running(); len(got) != 1 || got["R1"].ChildID != "C1" || got["R1"].HostID != "" {
		t.Fatalf("indexed %v; want R1 as its spec alone: a state under another provider than its spec's, and one of no spec, are no run's", got)
	}
	own := spec
	own.ChildID, own.Notify, own.HostID = "OTHER", "_INBOX.worker-fork.stolen", "fork.H1"
	put(store.RunStateKey("fork", "R1"), own)
	got := running()["R1"]
	if got.ChildID != "C1" || got.Notify != spec.Notify || got.HostID != "fork.H1" {
		t.Fatalf("indexed %+v; want the spec's child and notify with the state's host", got)
	}
	settled := store.Settled(own, "fork.H1", protocol.SubagentResult{StopReason: protocol.StopCompleted})
	put(store.RunStateKey("fork", "R1"), settled)
	if got := running(); len(got) != 0 {
		t.Fatalf("indexed %v after the run settled; want nothing", got)
	}
}

// A run's spec and state are created at once (store.CreateRun), so the
// runs watch may deliver the state first: the run is indexed all the same,
// running and unclaimed, so the orphan sweep finds it when the coordinator
// that created it stopped before any instance claimed it. Fails with the
// spec filed only as a spec (the run is never indexed until its state
// changes, which for such a run is never).
func TestTheRunIndexKeepsARunWhoseStateCameBeforeItsSpec(t *testing.T) {
	x := New(func() time.Duration { return time.Second }, time.Minute)
	put := putRecords[protocol.RunRecord](t, x.Put)
	spec := protocol.RunRecord{RunID: "R1", ChildID: "C1", ParentSession: "P1", Provider: "spawn", Mode: protocol.ModeOneShot,
		State: protocol.RunRunning, CreatedAt: 1}
	put(store.RunStateKey("spawn", "R1"), spec)
	put(store.RunSpecKey(spec.Provider, "R1"), spec)
	x.Orphans(func(protocol.RunRecord) bool { return false }, func(time.Duration) bool { return true }) // first sighting
	orphans := x.Orphans(func(protocol.RunRecord) bool { return false }, func(time.Duration) bool { return true })
	if len(orphans) != 1 || orphans[0].RunID != "R1" || orphans[0].HostID != "" || orphans[0].ChildID != "C1" {
		t.Fatalf("orphans %+v; want R1, running and unclaimed", orphans)
	}
	claimed := spec
	claimed.HostID = "spawn.H1"
	put(store.RunStateKey("spawn", "R1"), claimed)
	if got := x.Orphans(func(protocol.RunRecord) bool { return false }, func(time.Duration) bool { return true }); len(got) != 1 || got[0].HostID != "spawn.H1" {
		t.Fatalf("orphans %+v after the claim; want R1 claimed by spawn.H1", got)
	}
	put(store.RunStateKey("spawn", "R1"), store.Settled(claimed, "spawn.H1", protocol.SubagentResult{StopReason: protocol.StopCompleted}))
	if got := x.Orphans(func(protocol.RunRecord) bool { return false }, func(time.Duration) bool { return true }); len(got) != 0 {
		t.Fatalf("orphans %+v after the settlement; want none", got)
	}
	x.Forget("R1")
	put(store.RunSpecKey("spawn", "R2"), protocol.RunRecord{RunID: "R2", ChildID: "C2", Provider: "spawn", State: protocol.RunRunning})
	x.Forget("R2")
	if got := x.Orphans(func(protocol.RunRecord) bool { return false }, func(time.Duration) bool { return true }); len(got) != 0 {
		t.Fatalf("orphans %+v after forget; want none", got)
	}
}

// The runs the watch saw settle are kept for their notices (notices.go) as
// their spec joined with the settled state under the spec's provider, never
// a state under another provider's prefix, and within endedKeptMax.
func TestTheRunIndexKeepsSettledRunsForTheirNoticesWithinItsBounds(t *testing.T) {
	x := New(func() time.Duration { return time.Second }, time.Minute)
	put := putRecords[protocol.RunRecord](t, x.Put)
	spec := protocol.RunRecord{RunID: "R1", ChildID: "C1", ParentSession: "P1", Provider: "spawn", Mode: protocol.ModeOneShot,
		Notify: "_INBOX.client.n", State: protocol.RunRunning}
	put(store.RunSpecKey(spec.Provider, "R1"), spec)
	forged := spec
	forged.Notify, forged.ChildID = "_INBOX.worker-fork.stolen", "VICTIM"
	put(store.RunStateKey("fork", "R1"), store.Settled(forged, "fork.H1", protocol.SubagentResult{Output: protocol.Text("forged"), StopReason: protocol.StopCompleted}))
	if rec, ok := x.EndedRecord("R1"); ok {
		t.Fatalf("kept %+v from a state under another provider's prefix", rec)
	}
	put(store.RunStateKey("spawn", "R1"), store.Settled(forged, "spawn.H1", protocol.SubagentResult{Output: protocol.Text("done"), StopReason: protocol.StopCompleted}))
	rec, ok := x.EndedRecord("R1")
	if !ok || rec.Notify != spec.Notify || rec.ChildID != "C1" || rec.State != protocol.RunSettled || protocol.PlainText(rec.Result.Output) != "done" {
		t.Fatalf("kept %+v, %v; want R1 settled with the spec's child and notify and the state's result", rec, ok)
	}
	for i := range endedKeptMax {
		id := fmt.Sprintf("N%d", i)
		s := spec
		s.RunID = id
		put(store.RunSpecKey(s.Provider, id), s)
		put(store.RunStateKey("spawn", id), store.Settled(s, "spawn.H1", protocol.SubagentResult{StopReason: protocol.StopCompleted}))
	}
	if _, ok := x.EndedRecord("R1"); ok {
		t.Fatalf("R1 still kept after %d later runs settled; the bound is %d", endedKeptMax, endedKeptMax)
	}
	if _, ok := x.EndedRecord(fmt.Sprintf("N%d", endedKeptMax-1)); !ok {
		t.Fatal("the latest settled run is not kept")
	}
	if len(x.ended) != endedKeptMax || x.endedKept() != endedKeptMax {
		t.Fatalf("%d runs kept (%d in order); want %d", len(x.ended), x.endedKept(), endedKeptMax)
	}
	// Oldest out first, across compactions of the order: after another
	// bound's worth and a half, the runs kept are exactly the latest.
	for i := range endedKeptMax + endedKeptMax/2 {
		id := fmt.Sprintf("M%d", i)
		s := spec
		s.RunID = id
		put(store.RunSpecKey(s.Provider, id), s)
		put(store.RunStateKey("spawn", id), store.Settled(s, "spawn.H1", protocol.SubagentResult{StopReason: protocol.StopCompleted}))
	}
	for i := range endedKeptMax + endedKeptMax/2 {
		id := fmt.Sprintf("M%d", i)
		if _, ok := x.EndedRecord(id); ok != (i >= endedKeptMax/2) {
			t.Fatalf("run %s kept: %v; want only the latest %d kept", id, ok, endedKeptMax)
		}
	}
	if len(x.ended) != endedKeptMax || x.endedKept() != endedKeptMax || len(x.endedOrder) > 2*endedKeptMax {
		t.Fatalf("%d runs kept, %d in order in a slice of %d; want %d, at most twice that", len(x.ended), x.endedKept(), len(x.endedOrder), endedKeptMax)
	}
}
