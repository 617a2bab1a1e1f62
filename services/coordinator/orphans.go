package coordinator

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Orphaned run records (DESIGN.md §7; RELIABILITY.md, I6).
//
// A run or epoch record is settled by the host that holds its session's
// lease, or, when that host dies, by a coordinator taking the lease over. A
// record that is running with no lease for its run has neither: its start
// was cut short between two writes. Two windows leave one behind:
//
//   - an instance claimed the record (claim.go in internal/worker) and died
//     before it took the session's lease: the coordinator that dispatched the
//     start found the record claimed and answered it as started;
//   - the coordinator that created the record died before any instance
//     claimed it and before it could settle it never started.
//
// Every replica watches brood_runs for running records, and its monitor
// settles those that stayed without a lease for the host expiry, once their
// claimer is dead (or, unclaimed, once the start's budget passed): never
// started, HOST_LOST or UNAVAILABLE, by compare-and-set at the revision read
// from the bucket's leader; the claimer, holding its claim again once it
// holds the lease (store.HoldRun), then starts nothing, and a one-shot run's
// open turn is closed in its log. A one-shot run's caller gets its notice; a
// continuable child's pending messages are resumed (settleOrphan, in takeover.go).

// runIndex caches the running run and epoch records of brood_runs: each
// run's spec (store.RunSpecKey, which only coordinators write) joined with
// its state, read only under the provider its spec names
// (store.RunStateKey): a state a worker wrote under its own provider's key
// for another provider's run is not that run's.
type runIndex struct {
	clock func() time.Duration // the registry's observed clock
	mu    sync.Mutex
	m     map[string]*runState          // by run id
	specs map[string]protocol.RunRecord // the specs of runs not settled yet, by run id
}

type runState struct {
	rec protocol.RunRecord
	// leaseless is the observed time at which a sweep first found no lease
	// for the run (0: it had one, or no sweep looked yet).
	leaseless time.Duration
}

func newRunIndex(clock func() time.Duration) *runIndex {
	return &runIndex{clock: clock, m: map[string]*runState{}, specs: map[string]protocol.RunRecord{}}
}

func (x *runIndex) put(key string, e jetstream.KeyValueEntry) {
	kind, provider, id := store.RunsKindOf(key)
	rec, err := store.Decode[protocol.RunRecord](e)
	x.mu.Lock()
	defer x.mu.Unlock()
	switch kind {
	case store.RunsSpec:
		// A spec is written before its state, so a watch delivers it
		// first; it is never written again.
		if err == nil && rec.RunID == id {
			x.specs[id] = rec
		}
		return
	case store.RunsState:
	default:
		return
	}
	spec, ok := x.specs[id]
	if !ok || spec.Provider != provider {
		return // no run's state: no spec, or another provider's key
	}
	if err != nil || rec.State != protocol.RunRunning {
		delete(x.m, id)
		if err == nil {
			delete(x.specs, id) // settled: not indexed again
		}
		return
	}
	rec = store.JoinRun(spec, rec)
	if s, ok := x.m[id]; ok {
		s.rec = rec
		return
	}
	x.m[id] = &runState{rec: rec}
}

func (x *runIndex) del(key string) {
	kind, provider, id := store.RunsKindOf(key)
	x.mu.Lock()
	defer x.mu.Unlock()
	switch kind {
	case store.RunsSpec:
		delete(x.specs, id)
		delete(x.m, id)
	case store.RunsState:
		if spec, ok := x.specs[id]; ok && spec.Provider == provider {
			delete(x.m, id)
		}
	}
}

// orphanJobs lists the settlements of orphaned records due now.
func (c *Coordinator) orphanJobs() []job {
	hasLease := func(r protocol.RunRecord) bool {
		l, ok := c.agents.get(r.ChildID, r.Provider) // a run's provider is its child's header's
		return ok && l.rec.RunID == r.RunID
	}
	var jobs []job
	for _, rec := range c.runs.orphans(hasLease, c.reg.expired) {
		if !c.orphanDue(rec) {
			continue
		}
		rec := rec
		jobs = append(jobs, job{rec.ChildID, func(ctx context.Context) { c.settleOrphan(ctx, rec) }})
	}
	return jobs
}
