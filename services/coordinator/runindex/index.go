// Package runindex is the coordinator's index of brood_runs
// (docs/architecture.md §6): the running run and epoch records, fed by the
// runs watch (kvwatch.Watch: Put, Del), for the orphan sweep
// (services/coordinator/orphans.go), the runs settled lately for their
// notices, and the keys a replica is to give their lifetime
// (services/coordinator/expiry.go).
package runindex

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Index caches the running run and epoch records of brood_runs: each
// run's spec (store.RunSpecKey, which only coordinators write) joined with
// its state, read only under the provider its spec names
// (store.RunStateKey): a state a worker wrote under its own provider's key
// for another provider's run is not that run's.
type Index struct {
	clock func() time.Duration // the registry's observed clock
	mu    sync.Mutex
	// m holds the running runs by run id, specs their specs (and those of
	// runs whose state is yet to come), specRevs the specs' revisions
	// (ExpireRunSpec names them). Removed at a settlement (or a spec's
	// delete, or the orphan sweep's forget); bound: the runs not settled.
	m        map[string]*runState
	specs    map[string]protocol.RunRecord
	specRevs map[string]uint64
	// expiring holds the brood_runs keys this replica is to give their
	// lifetime (expiry.go), by key; started is when this index was made
	// (a settled state written before it may predate brood_runs' TTLs).
	expiring map[string]*Expiry
	started  time.Time
	// grace is how long a key no run's lifetime covers is left before it
	// is given a TTL (expiry.go): a state's spec, written with it, may
	// come later.
	grace time.Duration
	// TTL is the lifetime of a settled run's keys (store.Store.RunsTTL),
	// set before the index is fed:
	// put reports it to the runs watch, which forgets them then (kvwatch.Watch).
	TTL time.Duration
	// ended holds the runs the watch saw settled lately (their spec joined
	// with their settled state), for the notices their hosts ask for next
	// (notices.go): a settlement is final, so what the watch delivered is
	// what a read from the bucket's leader would answer. Bounded by
	// endedKeptMax runs, endedKeptBytesMax bytes of records and
	// endedKeptFor; a run not found there is read from the leader.
	ended map[string]protocol.RunRecord
	// endedOrder[endedHead:] are the runs of ended, oldest first: a run
	// dropped only moves endedHead, and the slice is compacted once half
	// of it is dropped (keepEnded), so keeping a run costs O(1) amortized,
	// not a copy of every run kept (at the bound of 4,096 that copy was
	// 8 µs of the coordinator's CPU per one-shot run; issue 12's profile).
	endedOrder []endedRun
	endedHead  int
	endedBytes int
}

// endedRun is one run of Index.ended, in the order the watch saw it settle.
type endedRun struct {
	id    string
	bytes int
	at    time.Time
}

// The bounds of Index.ended.
const (
	endedKeptMax      = 4096
	endedKeptBytesMax = 8 << 20
	endedKeptFor      = 10 * time.Second
)

type runState struct {
	rec protocol.RunRecord
	// leaseless is the observed time at which a sweep first found no lease
	// for the run (0: it had one, or no sweep looked yet).
	leaseless time.Duration
}

// New returns an empty index on the observed clock clock (the host
// registry's) whose keys no run's lifetime covers get a TTL grace after
// the watch delivered them.
func New(clock func() time.Duration, grace time.Duration) *Index {
	return &Index{clock: clock, m: map[string]*runState{}, specs: map[string]protocol.RunRecord{}, ended: map[string]protocol.RunRecord{},
		specRevs: map[string]uint64{}, expiring: map[string]*Expiry{}, started: time.Now(), grace: grace}
}

// keepEnded files rec, a run the watch saw settled (size bytes as stored),
// in x.ended, dropping the oldest past the bounds. x.mu is held.
func (x *Index) keepEnded(rec protocol.RunRecord, size int) {
	now := time.Now()
	if _, ok := x.ended[rec.RunID]; ok || size > endedKeptBytesMax {
		return
	}
	x.ended[rec.RunID] = rec
	x.endedOrder = append(x.endedOrder, endedRun{id: rec.RunID, bytes: size, at: now})
	x.endedBytes += size
	for x.endedHead < len(x.endedOrder) && (x.endedKept() > endedKeptMax || x.endedBytes > endedKeptBytesMax || now.Sub(x.endedOrder[x.endedHead].at) > endedKeptFor) {
		delete(x.ended, x.endedOrder[x.endedHead].id)
		x.endedBytes -= x.endedOrder[x.endedHead].bytes
		x.endedOrder[x.endedHead] = endedRun{} // its id's memory is free to go
		x.endedHead++
	}
	if x.endedHead > 0 && x.endedHead >= len(x.endedOrder)/2 {
		x.endedOrder = append(x.endedOrder[:0], x.endedOrder[x.endedHead:]...)
		x.endedHead = 0
	}
}

// endedKept is how many runs x.ended holds. x.mu is held.
func (x *Index) endedKept() int { return len(x.endedOrder) - x.endedHead }

// EndedRecord returns run id as the watch saw it settle, if it is still
// kept (keepEnded).
func (x *Index) EndedRecord(id string) (protocol.RunRecord, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	rec, ok := x.ended[id]
	return rec, ok
}

// Put applies brood_runs key's value e and returns how long after e's
// creation the server removes it (kvwatch.Watch): RunsTTL for a settled state or
// a spec given its lifetime, 0 for any other.
func (x *Index) Put(key string, e jetstream.KeyValueEntry) time.Duration {
	kind, provider, id := store.RunsKindOf(key)
	rec, err := store.Decode[protocol.RunRecord](e)
	x.mu.Lock()
	defer x.mu.Unlock()
	switch kind {
	case store.RunsSpec:
		// A spec is never written again. Its state is written at the same
		// time (store.CreateRun), so a watch may deliver either first: a
		// state that came first was its creation record (a claim or a
		// settlement comes only after the coordinator had both), dropped
		// for want of its spec, so the spec stands for it, running and
		// unclaimed, until the state changes. A spec left with no state
		// (its state's creation failed) is dropped by the orphan sweep,
		// which finds no run (settleOrphan).
		//
		// A spec written again settled is one a coordinator gave its
		// lifetime (store.ExpireRunSpec): its run is settled, and nothing
		// is left to do for its keys; it lapses after RunsTTL.
		switch {
		case err == nil && rec.RunID == id && rec.Provider == provider && rec.State == protocol.RunSettled:
			delete(x.m, id)
			delete(x.specs, id)
			delete(x.specRevs, id)
			delete(x.expiring, key)
			delete(x.expiring, store.RunStateKey(rec.Provider, id))
			return x.TTL
		case err == nil && rec.RunID == id && rec.Provider == provider:
			x.specs[id], x.specRevs[id] = rec, e.Revision()
			if _, ok := x.m[id]; !ok && rec.State == protocol.RunRunning {
				x.m[id] = &runState{rec: rec}
			}
			delete(x.expiring, store.RunStateKey(rec.Provider, id)) // its state has its spec
		default:
			x.expireLater(key, e.Revision()) // names no run: no run's lifetime covers it
		}
		return 0
	case store.RunsState:
		x.putState(key, provider, id, rec, err, e)
		// A settled state lapses after RunsTTL (store.SettleRun's TTL),
		// unless this index is to give it a lifetime (expireLater: it may
		// have none).
		if _, filed := x.expiring[key]; err == nil && rec.State == protocol.RunSettled && !filed {
			return x.TTL
		}
		return 0
	default:
		x.expireLater(key, e.Revision())
		return 0
	}
}

// putState applies the state rec (decoded from e with err) of run id of
// provider under key. x.mu is held.
func (x *Index) putState(key, provider, id string, rec protocol.RunRecord, err error, e jetstream.KeyValueEntry) {
	spec, ok := x.specs[id]
	if !ok || spec.Provider != provider {
		// No run's state: no spec (yet: a watch may deliver a state before
		// its spec, store.CreateRun), or another provider's key.
		x.expireLater(key, e.Revision())
		return
	}
	if err != nil || rec.State != protocol.RunRunning {
		delete(x.m, id)
		if err == nil {
			delete(x.specs, id) // settled: not indexed again
			if rec.State == protocol.RunSettled {
				// Its spec is given the settled state's lifetime; a state
				// written before this replica started may predate TTLs.
				x.expireSpec(spec, x.specRevs[id], key, e.Revision(), e.Created().Before(x.started))
			} else {
				// Neither running nor settled (its provider's workers
				// wrote it): no run any more; both keys get a lifetime.
				x.expireSpec(spec, x.specRevs[id], "", 0, false)
				x.expireLater(key, e.Revision())
			}
			delete(x.specRevs, id)
			if rec.State == protocol.RunSettled && rec.Result != nil {
				x.keepEnded(store.JoinRun(spec, rec), len(e.Value()))
			}
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

// Forget drops run id from the index (a spec with no state: no run) and
// gives its spec a lifetime.
func (x *Index) Forget(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if spec, ok := x.specs[id]; ok {
		x.expireSpec(spec, x.specRevs[id], "", 0, false)
	}
	delete(x.m, id)
	delete(x.specs, id)
	delete(x.specRevs, id)
}

func (x *Index) Del(key string) {
	kind, provider, id := store.RunsKindOf(key)
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.expiring, key)
	switch kind {
	case store.RunsSpec:
		delete(x.specs, id)
		delete(x.specRevs, id)
		delete(x.m, id)
	case store.RunsState:
		if spec, ok := x.specs[id]; ok && spec.Provider == provider {
			delete(x.m, id)
		}
	}
}

// Orphans returns the running records that stayed without a lease for their
// run for at least the host expiry by the observed clock, noting the first
// sighting of the others; hasLease reports whether a run's session holds a
// lease for it.
func (x *Index) Orphans(hasLease func(protocol.RunRecord) bool, expired func(since time.Duration) bool) []protocol.RunRecord {
	obs := x.clock()
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []protocol.RunRecord
	for _, s := range x.m {
		switch {
		case hasLease(s.rec):
			s.leaseless = 0
		case s.leaseless == 0:
			s.leaseless = obs
		case expired(s.leaseless):
			out = append(out, s.rec)
		}
	}
	return out
}
