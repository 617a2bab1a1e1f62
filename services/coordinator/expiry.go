package coordinator

import (
	"context"
	"errors"
	"hash/fnv"
	"slices"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/services/coordinator/runindex"
)

// The lifetime of brood_runs' keys (RELIABILITY.md, "a run or epoch that
// runs longer than RunsMaxAge"). The bucket has no max age: a running run's
// records never expire. A settled run's state is written with a TTL of
// RunsMaxAge by its settlement (store.SettleRun); its spec, which only
// coordinators write, is given the same TTL by a coordinator once its runs
// watch saw the settlement (store.ExpireRunSpec), off every reply path. Every
// other key is given one too, so nothing lives for good by accident:
//
//   - a spec whose state was never created (its coordinator failed or died
//     between the two writes of store.CreateRun): once the orphan sweep
//     finds no run for it (settleOrphan, runindex.Index.Forget);
//   - a state with no spec of its provider (the same window the other way
//     round, or a worker's key for a run of another provider), and a key of
//     no known layout: the start's budget and the host expiry (Config
//     RequestBudget + HostExpiry, as an unclaimed orphan) after the watch
//     delivered it, unless its spec came meanwhile (store.ExpireRunsKey);
//   - a settled state written before this replica started, whose spec had
//     no TTL yet: it may predate brood_runs' TTLs (a deployment upgraded
//     from the bucket's max age), so it is given one unless it has one.
//
// The runs watch delivers every key's value when a replica starts, so a
// spec left without its TTL (a coordinator that died between a settlement
// and the spec's rewrite) is given it by the next replica to start. Every
// write is a compare-and-set at the revision the watch delivered, so
// replicas racing on a key are safe; to make one write per key the rule, a
// replica ranks the live coordinators by a hash of the key and acts
// expiryStagger after the one before it (the first at once): the others see
// the rewritten spec through their watch and drop theirs.

// Bounds of the lifetime work; the keys filed and the attempts at each are
// bounded by the run index (runindex.ExpiryAttemptsMax).
const (
	// expiryStagger is how long after the replica before it in a key's
	// rank a replica gives the key its lifetime.
	expiryStagger = 10 * time.Second
	// expiryWritesPerSweepMax bounds the lifetime writes one sweep of
	// the monitor starts (each a goroutine and a KV write); the rest wait
	// for the next sweep.
	expiryWritesPerSweepMax = 4096
)

// expiryDelay returns how long after a key is due this replica acts on it:
// its rank among the live coordinators (live) in the order that starts at
// the one the key's hash picks, times expiryStagger; a replica not among
// them comes last.
func expiryDelay(self string, live []string, key string) time.Duration {
	n := len(live)
	i := slices.Index(live, self)
	if i < 0 {
		return time.Duration(n) * expiryStagger
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	first := int(h.Sum32() % uint32(n))
	return time.Duration((i-first+n)%n) * expiryStagger
}

// expiryJobs lists the lifetime writes due now (see the top of this file).
func (c *Coordinator) expiryJobs() []job {
	live := c.reg.LiveCoordinators()
	due := c.runs.ExpiryDue(time.Now(), func(key string) time.Duration { return expiryDelay(c.cfg.ID, live, key) }, expiryWritesPerSweepMax)
	jobs := make([]job, 0, len(due))
	for key, e := range due {
		jobs = append(jobs, job{"runs-ttl:" + key, func(ctx context.Context) { c.expireRunsKey(ctx, key, e) }})
	}
	return jobs
}

// expireRunsKey gives key its lifetime (see the top of this file).
func (c *Coordinator) expireRunsKey(ctx context.Context, key string, e runindex.Expiry) {
	var err error
	switch {
	case e.Spec != nil:
		if e.State != "" {
			if _, err = c.st.ExpireRunsKey(ctx, e.State, e.StateRev); err != nil {
				break
			}
		}
		_, err = c.st.ExpireRunSpec(ctx, *e.Spec, e.Rev)
	default:
		if kind, provider, id := store.RunsKindOf(key); kind == store.RunsState {
			// Its spec may have come without this replica's watch
			// delivering it yet: read from the leader.
			spec, serr := c.st.RunSpecLatest(ctx, provider, id)
			switch {
			case serr == nil && spec.Value.Provider == provider && spec.Value.RunID == id:
				c.runs.ExpiryDone(key, e.Rev, false) // a run's state: its run's lifetime covers it
				return
			case serr != nil && !errors.Is(serr, store.ErrNotFound):
				err = serr
			}
		}
		if err == nil {
			_, err = c.st.ExpireRunsKey(ctx, key, e.Rev)
		}
	}
	if c.runs.ExpiryDone(key, e.Rev, err != nil) {
		c.log.Warn("a brood_runs key was not given its lifetime; the next coordinator to start tries again", "key", key, "attempts", runindex.ExpiryAttemptsMax, "err", err)
	}
}
