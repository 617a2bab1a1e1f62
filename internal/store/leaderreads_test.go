package store_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// A worker's store (WithLeaderReads) reads its own providers' records from
// the buckets' leaders through the function it was given (the
// coordinators' KVLatest, which a permission can scope; a leader get
// cannot be): GetLatest and a refused compare-and-set's check of its
// scopes' keys go through it, an UNAVAILABLE answer is tried again, and
// every other key is read from the leader as before.
func TestAWorkersLeaderReadsOfItsOwnRecordsGoThroughItsReader(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	var mu sync.Mutex
	var asked []string
	unavailable := 1
	scoped := st.WithLeaderReads([]string{"spawn"}, func(ctx context.Context, bucket, key string) ([]byte, uint64, bool, error) {
		mu.Lock()
		asked = append(asked, bucket+"/"+key)
		fail := unavailable > 0
		unavailable--
		mu.Unlock()
		if fail {
			return nil, 0, false, protocol.Errorf(protocol.CodeUnavailable, "no coordinator")
		}
		return store.LeaderGet(ctx, st.Runs, key)
	})
	took := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := asked
		asked = nil
		return out
	}
	rec := protocol.RunRecord{RunID: "R1", ChildID: "C1", Provider: "spawn", Mode: protocol.ModeOneShot, State: protocol.RunRunning, CreatedAt: 1}
	rev, err := st.CreateRun(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	got, err := scoped.RunLatestOf(ctx, "spawn", "R1")
	if err != nil || got.Revision != rev || got.Value.ChildID != "C1" {
		t.Fatalf("RunLatestOf through the reader: %+v at %d, %v", got.Value, got.Revision, err)
	}
	if r := took(); !slices.Contains(r, st.Subj.BucketRuns()+"/"+store.RunStateKey("spawn", "R1")) || len(r) < 2 {
		t.Fatalf("the reader was asked %q; want the state, twice (the first answer UNAVAILABLE)", r)
	}
	// A claim that lost: its refusal is decided by a read through the reader.
	claimed, claimRev, err := st.ClaimRun(ctx, rec, rev, "spawn.H1")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := scoped.ClaimRun(ctx, rec, rev, "spawn.H2"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a second claim: %v, want ErrConflict", err)
	}
	if r := took(); !slices.Equal(r, []string{st.Subj.BucketRuns() + "/" + store.RunStateKey("spawn", "R1")}) {
		t.Fatalf("the reader was asked %q for a refused claim; want the state", r)
	}
	// Its writes pass through, the settlement's TTL'd compare-and-set too.
	if won, err := scoped.SettleRun(ctx, store.Settled(claimed, "spawn.H1", protocol.SubagentResult{StopReason: protocol.StopCompleted}), claimRev); err != nil || !won {
		t.Fatalf("a settlement through the worker's store: %v, %v", won, err)
	}
	took()
	// Another provider's record: not through the reader.
	other := rec
	other.RunID, other.Provider = "R2", "fork"
	if _, err := st.CreateRun(ctx, other); err != nil {
		t.Fatal(err)
	}
	if got, err := scoped.RunLatest(ctx, "R2"); err != nil || got.Value.Provider != "fork" {
		t.Fatalf("RunLatest of a fork run: %+v, %v", got.Value, err)
	}
	if r := took(); len(r) != 0 {
		t.Fatalf("the reader was asked %q for another provider's records; want nothing", r)
	}
}
