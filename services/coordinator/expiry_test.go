package coordinator_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// Tests of the lifetime of brood_runs' keys (expiry.go): a run's records
// never expire while it runs and expire RunsMaxAge after its settlement,
// and no other key lives for good.

// runsMaxAge is the RunsMaxAge of these tests (the least TTL is 1 s).
const runsMaxAge = 2 * time.Second

// shortRuns is a stack whose services give settled runs' records a
// lifetime of runsMaxAge (brood_runs has no max age: the setting is each
// settlement's TTL, so it is set after provisioning, before any service
// binds the store).
func shortRuns(t *testing.T) *stack.Stack {
	s := stack.New(t)
	s.Store.Cfg.RunsMaxAge = runsMaxAge
	return s
}

// runsKeyGone reports whether key of brood_runs is gone (read from the
// leader).
func runsKeyGone(t *testing.T, s *stack.Stack, key string) func() bool {
	return func() bool {
		_, err := store.GetLatest[protocol.RunRecord](context.Background(), s.Store.Runs, key)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
		return err != nil
	}
}

// expiresDeadline bounds how long a settled run's records may stay: its
// TTL, a sweep or two, the server's expiry timer, with room for -race.
const expiresDeadline = runsMaxAge + 15*time.Second

// TestASettledRunsRecordsExpireAndARunningOnesDoNot: the spec and state of
// a run settled by its host, of an orphaned run the coordinator settled
// (HOST_LOST: it writes the settlement itself), and the half of a run
// whose creation failed halfway (a spec with no state, a state with no
// spec) are gone within about RunsMaxAge; a run claimed by a live host
// keeps both for three RunsMaxAge meanwhile. Before, with the bucket's max
// age gone, none of them would ever expire; with it, the running one's
// went too.
func TestASettledRunsRecordsExpireAndARunningOnesDoNot(t *testing.T) {
	s := shortRuns(t)
	co := s.AddCoordinator(func(c *coordinator.Config) { c.RequestBudget = 2 * time.Second })
	s.AddSpawnWorker()
	root := s.Root()
	ctx := context.Background()

	// A run its host settled.
	run, _, err := s.Run(root.Ref(), "spawn", "hello", protocol.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	settled, err := runOf(s, run.RunID)
	if err != nil || settled.State != protocol.RunSettled {
		t.Fatalf("the host's run: %+v, %v", settled, err)
	}
	// An orphaned run (claimed by a host that died), and one claimed by a
	// live host (the coordinator's heartbeat stands in for it).
	for _, r := range []struct{ child, run, host string }{{"orphan-child", "orphan-run", deadHost}, {"live-child", "live-run", co.ID()}} {
		putChild(t, s, root, r.child)
		putRun(t, s, protocol.RunRecord{RunID: r.run, ChildID: r.child, ParentSession: root.SessionID, Provider: "spawn",
			Mode: protocol.ModeOneShot, State: protocol.RunRunning, CreatedAt: store.NowMs(), HostID: r.host, StartedAt: store.NowMs()})
	}
	// Halves of runs: a spec whose state was never created (its start's
	// budget long past) and a state whose spec was never created.
	half := protocol.RunRecord{RunID: "spec-only", ChildID: "spec-only-child", ParentSession: root.SessionID, Provider: "spawn",
		Mode: protocol.ModeOneShot, State: protocol.RunRunning, CreatedAt: store.NowMs() - time.Hour.Milliseconds()}
	if _, err := store.Create(ctx, s.Store.Runs, store.RunSpecKey(half.Provider, half.RunID), half); err != nil {
		t.Fatal(err)
	}
	half.RunID = "state-only"
	if _, err := store.Create(ctx, s.Store.Runs, store.RunStateKey(half.Provider, half.RunID), half); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool {
		r, err := runOf(s, "orphan-run")
		return err == nil && r.State == protocol.RunSettled && r.SettledBy == co.ID()
	}, "the orphaned run is settled by the coordinator")

	for _, key := range []string{
		store.RunSpecKey("spawn", run.RunID), store.RunStateKey("spawn", run.RunID),
		store.RunSpecKey("spawn", "orphan-run"), store.RunStateKey("spawn", "orphan-run"),
		store.RunSpecKey("spawn", "spec-only"), store.RunStateKey("spawn", "state-only"),
	} {
		testutil.Eventually(t, expiresDeadline, runsKeyGone(t, s, key), "%s expires", key)
	}
	// By now the live run has outlived RunsMaxAge; three more.
	testutil.Consistently(t, 3*runsMaxAge, func() bool {
		r, err := runOf(s, "live-run")
		return err == nil && r.State == protocol.RunRunning && !runsKeyGone(t, s, store.RunSpecKey("spawn", "live-run"))()
	}, "a running run's records are kept")
}

// TestACoordinatorStartingGivesLeftoverRecordsTheirLifetime: a coordinator
// that died between a run's settlement (its state written with its TTL)
// and the rewrite of its spec left a spec that would never expire, and a
// deployment upgraded from brood_runs' max age has settled states with no
// TTL at all: the next coordinator to start gives both theirs, from its
// runs watch's first values. Before, they stayed for good.
func TestACoordinatorStartingGivesLeftoverRecordsTheirLifetime(t *testing.T) {
	s := shortRuns(t)
	ctx := context.Background()
	res := protocol.SubagentResult{StopReason: protocol.StopCompleted, Output: protocol.Text("done")}
	for _, r := range []struct {
		run string
		ttl bool // the settlement carries its TTL (store.SettleRun); else one from before
	}{{"settled-no-spec-ttl", true}, {"settled-before-the-upgrade", false}} {
		rec := protocol.RunRecord{RunID: r.run, ChildID: r.run + "-child", ParentSession: "P", Provider: "spawn", Mode: protocol.ModeOneShot,
			State: protocol.RunRunning, CreatedAt: store.NowMs(), HostID: "H", StartedAt: store.NowMs()}
		rev := testutil.PutRun(t, s.Store, rec)
		done := store.Settled(rec, "H", res)
		if r.ttl {
			if won, err := s.Store.SettleRun(ctx, done, rev); err != nil || !won {
				t.Fatalf("settle %s: %v, %v", r.run, won, err)
			}
		} else if _, err := store.Update(ctx, s.Store.Runs, store.RunStateKey("spawn", r.run), done, rev); err != nil {
			t.Fatal(err)
		}
	}
	// With no coordinator, the first spec outlives its state.
	testutil.Eventually(t, expiresDeadline, runsKeyGone(t, s, store.RunStateKey("spawn", "settled-no-spec-ttl")), "the settled state expires")
	testutil.Consistently(t, 2*runsMaxAge, func() bool {
		for _, key := range []string{store.RunSpecKey("spawn", "settled-no-spec-ttl"), store.RunSpecKey("spawn", "settled-before-the-upgrade"), store.RunStateKey("spawn", "settled-before-the-upgrade")} {
			if runsKeyGone(t, s, key)() {
				t.Logf("%s expired with no coordinator", key)
				return false
			}
		}
		return true
	}, "with no coordinator, the specs and the state with no TTL stay")
	s.AddCoordinator()
	for _, key := range []string{store.RunSpecKey("spawn", "settled-no-spec-ttl"), store.RunSpecKey("spawn", "settled-before-the-upgrade"), store.RunStateKey("spawn", "settled-before-the-upgrade")} {
		testutil.Eventually(t, expiresDeadline, runsKeyGone(t, s, key), "%s expires once a coordinator started", key)
	}
}

// TestTheWatchesForgetKeysThatExpired: the brood_runs keys of settled runs
// and a user grant's key expire by their TTL, which the server removes
// without a delete any watch sees (no subject delete markers: they need
// roll-ups); the coordinator's watches forget them once they lapsed, so a
// long-lived replica holds the keys its buckets hold, not every key it ever
// saw. Before, its runs watch kept two keys per run, and its agents watch
// every grant, until it restarted.
func TestTheWatchesForgetKeysThatExpired(t *testing.T) {
	const runs = 5
	s := shortRuns(t)
	co := s.AddCoordinator(func(c *coordinator.Config) { c.GrantTTL = time.Second })
	s.AddSpawnWorker()
	root := s.Root()
	ctx := context.Background()
	g, err := s.Client.UserGrant(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var last string
	for i := 0; i < runs; i++ {
		run, _, err := s.Run(root.Ref(), "spawn", "hello", protocol.StartOptions{})
		if err != nil {
			t.Fatal(err)
		}
		last = run.RunID
	}
	testutil.Eventually(t, expiresDeadline, func() bool {
		_, _, n := co.WatchedKeys()
		return n >= 2*runs // every run's spec and state seen
	}, "the runs watch sees the runs")
	for _, key := range []string{store.RunSpecKey("spawn", last), store.RunStateKey("spawn", last)} {
		testutil.Eventually(t, expiresDeadline, runsKeyGone(t, s, key), "%s expires", key)
	}
	testutil.Eventually(t, expiresDeadline, func() bool {
		_, err := s.Store.Grant(ctx, protocol.HashCredential(g.Grant))
		return errors.Is(err, store.ErrNotFound)
	}, "the grant expires")
	// The watches hold the keys the buckets hold, and no more.
	testutil.Eventually(t, expiresDeadline, func() bool {
		_, agents, runs := co.WatchedKeys()
		return runs == int64(bucketKeys(t, s.Store.Runs)) && agents == int64(bucketKeys(t, s.Store.Agents))
	}, "the watches forget the expired keys")
}

// bucketKeys is the number of keys kv holds.
func bucketKeys(t *testing.T, kv jetstream.KeyValue) int {
	keys, err := kv.ListKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range keys.Keys() {
		n++
	}
	return n
}
