package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// runsMaxAgeShort is the RunsMaxAge of the lifetime tests: the least
// per-message TTL the server takes is 1 s, so 2 s is short enough to
// outlive several times over and long enough to tell "gone" from "kept".
const runsMaxAgeShort = 2 * time.Second

// A run's records never expire while it runs, and expire RunsMaxAge after
// it settled (RELIABILITY.md, "a run or epoch that runs longer than
// RunsMaxAge"): a one-shot run and a continuable child's epoch (each epoch
// is a run with its own spec, held by its host once it holds the lease),
// created, claimed and left running for three RunsMaxAge, keep their spec
// and state (and their lifecycle events stay readable); the host's
// settlement then lands, and once a coordinator gave the spec its
// lifetime (ExpireRunSpec) both are gone within about RunsMaxAge. Before
// the fix (brood_runs had a max age of RunsMaxAge) both were gone while the
// run ran and the settlement never landed.
func TestARunsRecordsLiveWhileItRunsAndExpireAfterItsSettlement(t *testing.T) {
	cfg := store.DefaultConfig()
	cfg.RunsMaxAge = runsMaxAgeShort
	st := testutil.StoreWith(t, testutil.Connect(t, testutil.Server(t).ClientURL()), cfg)
	for _, tc := range []struct {
		name, mode string
		hold       bool // an epoch: held by its host once it holds the lease
	}{
		{"one-shot run", protocol.ModeOneShot, false},
		{"continuable epoch", protocol.ModeContinuable, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			rec := protocol.RunRecord{RunID: "R-" + tc.mode, ChildID: "C-" + tc.mode, ParentSession: "P1", Provider: "spawn",
				Mode: tc.mode, State: protocol.RunRunning, CreatedAt: store.NowMs()}
			rev, err := st.CreateRun(ctx, rec)
			if err != nil {
				t.Fatal(err)
			}
			claimed, rev, err := st.ClaimRun(ctx, rec, rev, "H1")
			if err != nil {
				t.Fatal(err)
			}
			if tc.hold {
				if rev, err = st.HoldRun(ctx, claimed, rev); err != nil {
					t.Fatal(err)
				}
			}
			ev := protocol.LifecycleEvent{Type: protocol.LifecycleStart, RunID: rec.RunID, Provider: rec.Provider, ID: rec.ChildID, ParentSession: rec.ParentSession, Mode: rec.Mode}
			// A store of its own at each read: a store caches the specs it read.
			fresh := func() *store.Store {
				s, err := store.Bind(ctx, st.NC, st.Subj)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			kept := func() bool {
				r, err := fresh().RunLatest(ctx, rec.RunID)
				if err != nil || r.Value.State != protocol.RunRunning || r.Value.HostID != "H1" {
					t.Logf("run read while it runs: %+v, %v", r.Value, err)
					return false
				}
				spec, err := store.GetLatest[protocol.RunRecord](ctx, st.Runs, store.RunSpecKey(rec.Provider, rec.RunID))
				if err != nil || spec.Value.RunID != rec.RunID {
					t.Logf("spec read while it runs: %v", err)
					return false
				}
				ok, err := fresh().EventOfItsRun(ctx, ev)
				return ok && err == nil
			}
			testutil.Consistently(t, 3*runsMaxAgeShort+time.Second, kept, "run %s's records are kept while it runs", rec.RunID)
			won, err := st.SettleRun(ctx, store.Settled(claimed, "H1", protocol.SubagentResult{
				StopReason: protocol.StopCompleted, Output: protocol.Text("done")}), rev)
			if err != nil || !won {
				t.Fatalf("settlement after 3 RunsMaxAge: won %v, %v", won, err)
			}
			spec, err := store.GetLatest[protocol.RunRecord](ctx, st.Runs, store.RunSpecKey(rec.Provider, rec.RunID))
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := st.ExpireRunSpec(ctx, spec.Value, spec.Revision); !ok || err != nil {
				t.Fatalf("expire the spec: %v, %v", ok, err)
			}
			if ok, err := st.ExpireRunSpec(ctx, spec.Value, spec.Revision); !ok || err != nil {
				t.Fatalf("expire the spec again at the same revision (another coordinator's identical write): %v, %v, want true", ok, err)
			}
			if r, err := fresh().Run(ctx, rec.RunID); err != nil || r.Value.State != protocol.RunSettled || r.Value.Result == nil {
				t.Fatalf("the settled run read back before its records expired: %+v, %v", r.Value, err)
			}
			settledAt := time.Now()
			gone := func(key string) func() bool {
				return func() bool {
					_, err := store.GetLatest[protocol.RunRecord](ctx, st.Runs, key)
					return errors.Is(err, store.ErrNotFound)
				}
			}
			testutil.Eventually(t, 3*runsMaxAgeShort, gone(store.RunStateKey(rec.Provider, rec.RunID)), "the settled state expires")
			testutil.Eventually(t, 3*runsMaxAgeShort, gone(store.RunSpecKey(rec.Provider, rec.RunID)), "the expired spec expires")
			if d := time.Since(settledAt); d < runsMaxAgeShort-500*time.Millisecond {
				t.Fatalf("the settled run's records were gone %s after its settlement, before RunsMaxAge %s", d, runsMaxAgeShort)
			}
		})
	}
}

// SettleRun's write with a TTL passes the store's fault seam as a KV
// update (chaos and the tests that hold or fail a settlement see it):
// a refusal fails it, a lost answer of a write that landed is recognised
// as landed.
func TestSettleRunPassesTheFaultSeam(t *testing.T) {
	cfg := store.DefaultConfig()
	cfg.RunsMaxAge = runsMaxAgeShort
	st := testutil.StoreWith(t, testutil.Connect(t, testutil.Server(t).ClientURL()), cfg)
	ctx := context.Background()
	rec := protocol.RunRecord{RunID: "R1", ChildID: "C1", ParentSession: "P1", Provider: "spawn", Mode: protocol.ModeOneShot, State: protocol.RunRunning}
	rev, err := st.CreateRun(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	var seen []store.Write
	refuse := errors.New("refused by the test")
	lost := errors.New("answer lost")
	f := st.WithFaults(store.Faults{
		Before: func(_ context.Context, w store.Write) error {
			if w.Bucket == st.Runs.Bucket() {
				seen = append(seen, w)
				if len(seen) == 1 {
					return refuse
				}
			}
			return nil
		},
		After: func(_ context.Context, w store.Write, err error) error {
			if err == nil && w.Bucket == st.Runs.Bucket() && len(seen) == 2 {
				return lost // landed, its answer lost: retried and recognised
			}
			return err
		},
	})
	settled := store.NotStarted(rec, "COORD", errors.New("no instance"))
	if _, err := f.SettleRun(ctx, settled, rev); !errors.Is(err, refuse) {
		t.Fatalf("a settlement refused by the seam: %v", err)
	}
	// The seam's lost answer is not transient: use a Transient one.
	lost = context.DeadlineExceeded
	won, err := f.SettleRun(ctx, settled, rev)
	if err != nil || !won {
		t.Fatalf("a settlement whose answer was lost: won %v, %v", won, err)
	}
	if len(seen) < 3 {
		t.Fatalf("writes seen by the seam: %d, want the refused one, the lost one and its retry", len(seen))
	}
	for _, w := range seen {
		if w.Op != store.OpKVUpdate || w.Key != store.RunStateKey("spawn", "R1") || w.Revision != rev || w.TTL != 2*time.Second {
			t.Fatalf("the seam saw %+v, want a KV update of the state at revision %d with a TTL of 2s", w, rev)
		}
	}
}
