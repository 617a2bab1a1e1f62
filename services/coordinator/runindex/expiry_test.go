package runindex

import (
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestTheRunIndexFilesEveryKeyForItsLifetime: what the runs watch delivers
// decides which brood_runs keys a replica gives a TTL (expiry.go): a
// settled run's spec at once (at the spec's revision, with its state when
// written before the replica started), a state with no spec of its
// provider only after the grace, and nothing for a running run, a state
// whose spec came after it, or a spec another replica already rewrote
// settled.
func TestTheRunIndexFilesEveryKeyForItsLifetime(t *testing.T) {
	const grace = time.Minute
	// The coordinator's bound of the writes of one sweep
	// (expiryWritesPerSweepMax), and the delay of a replica ranked second
	// for a key (expiryStagger).
	const expiryWritesPerSweepMax, expiryStagger = 4096, 10 * time.Second
	x := New(func() time.Duration { return 0 }, grace)
	put := putRecords[protocol.RunRecord](t, x.Put)
	rec := func(id, provider, state string) protocol.RunRecord {
		return protocol.RunRecord{RunID: id, ChildID: "C" + id, Provider: provider, Mode: protocol.ModeOneShot, State: state}
	}
	settled := func(id string) protocol.RunRecord {
		r := rec(id, "spawn", protocol.RunSettled)
		r.Result = &protocol.SubagentResult{StopReason: protocol.StopCompleted}
		return r
	}
	// R1 runs; R2 settles (spec at revision 3); R3's state comes before its
	// spec; R4's state names another provider; R5's spec was rewritten
	// settled by another replica after its state settled.
	put(store.RunSpecKey("spawn", "R1"), rec("R1", "spawn", protocol.RunRunning))
	put(store.RunStateKey("spawn", "R1"), rec("R1", "spawn", protocol.RunRunning))
	put(store.RunSpecKey("spawn", "R2"), rec("R2", "spawn", protocol.RunRunning)) // revision 3
	put(store.RunStateKey("spawn", "R2"), rec("R2", "spawn", protocol.RunRunning))
	put(store.RunStateKey("spawn", "R2"), settled("R2"))
	put(store.RunStateKey("spawn", "R3"), rec("R3", "spawn", protocol.RunRunning))
	put(store.RunSpecKey("spawn", "R3"), rec("R3", "spawn", protocol.RunRunning))
	put(store.RunSpecKey("spawn", "R4"), rec("R4", "spawn", protocol.RunRunning))
	put(store.RunStateKey("fork", "R4"), rec("R4", "fork", protocol.RunRunning)) // revision 9
	put(store.RunStateKey("spawn", "R5"), settled("R5"))
	put(store.RunSpecKey("spawn", "R5"), settled("R5"))
	put("junk", rec("J", "spawn", protocol.RunRunning)) // revision 12

	now := time.Now()
	none := func(string) time.Duration { return 0 }
	due := x.ExpiryDue(now, none, expiryWritesPerSweepMax)
	if len(due) != 1 {
		t.Fatalf("due at once: %v, want the settled run's spec only", keys(due))
	}
	e, ok := due[store.RunSpecKey("spawn", "R2")]
	if !ok || e.Spec == nil || e.Spec.RunID != "R2" || e.Rev != 3 {
		t.Fatalf("the settled run's entry: %+v", e)
	}
	// The index's states are delivered with a zero creation time, before
	// the index started: the state is checked for a TTL too.
	if e.State != store.RunStateKey("spawn", "R2") || e.StateRev != 5 {
		t.Fatalf("the settled state to check: %q at %d, want %q at 5", e.State, e.StateRev, store.RunStateKey("spawn", "R2"))
	}
	later := x.ExpiryDue(now.Add(grace+time.Second), none, expiryWritesPerSweepMax)
	if len(later) != 3 || later[store.RunStateKey("fork", "R4")].Rev != 9 || later["junk"].Rev != 12 || later[store.RunSpecKey("spawn", "R2")].Spec == nil {
		t.Fatalf("due after the grace: %v, want R2's spec, R4's state under fork and the key of no layout", keys(later))
	}
	// A sweep starts at most its bound of writes.
	if d := x.ExpiryDue(now.Add(grace+time.Second), none, 2); len(d) != 2 {
		t.Fatalf("due with a bound of 2: %v", keys(d))
	}
	// A replica later in the key's rank acts later.
	if d := x.ExpiryDue(now, func(string) time.Duration { return expiryStagger }, expiryWritesPerSweepMax); len(d) != 0 {
		t.Fatalf("due at once for a replica ranked second: %v", keys(d))
	}
	// Done: gone. A failure keeps the key until ExpiryAttemptsMax.
	if x.ExpiryDone(store.RunSpecKey("spawn", "R2"), 3, false) {
		t.Fatal("a key given its lifetime reported as given up")
	}
	for i := 1; i < ExpiryAttemptsMax; i++ {
		if x.ExpiryDone("junk", 12, true) {
			t.Fatalf("given up after %d failures", i)
		}
	}
	if !x.ExpiryDone("junk", 12, true) {
		t.Fatal("not given up after ExpiryAttemptsMax failures")
	}
	if left := x.ExpiryDue(now.Add(grace+time.Second), none, expiryWritesPerSweepMax); len(left) != 1 {
		t.Fatalf("left: %v, want R4's state", keys(left))
	}
	// The spec rewritten settled, delivered by the watch, ends its entry.
	put(store.RunSpecKey("spawn", "R6"), rec("R6", "spawn", protocol.RunRunning))
	put(store.RunStateKey("spawn", "R6"), settled("R6"))
	put(store.RunSpecKey("spawn", "R6"), settled("R6"))
	if _, ok := x.ExpiryDue(now, none, expiryWritesPerSweepMax)[store.RunSpecKey("spawn", "R6")]; ok {
		t.Fatal("a spec another replica rewrote settled is still to expire")
	}
}

func keys(m map[string]Expiry) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
