package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Orphaned run records (docs/design.md §7; RELIABILITY.md, I6).
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
// continuable child's pending messages are resumed (settleOrphan, below).

// runIndex caches the running run and epoch records of brood_runs: each
// run's spec (store.RunSpecKey, which only coordinators write) joined with
// its state, read only under the provider its spec names
// (store.RunStateKey): a state a worker wrote under its own provider's key
// for another provider's run is not that run's.
type runIndex struct {
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
	expiring map[string]*runsExpiry
	started  time.Time
	// grace is how long a key no run's lifetime covers is left before it
	// is given a TTL (expiry.go): a state's spec, written with it, may
	// come later.
	grace time.Duration
	// ttl is the lifetime of a settled run's keys (store.Store.RunsTTL):
	// put reports it to the runs watch, which forgets them then (kvwatch.Watch).
	ttl time.Duration
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

// endedRun is one run of runIndex.ended, in the order the watch saw it settle.
type endedRun struct {
	id    string
	bytes int
	at    time.Time
}

// The bounds of runIndex.ended.
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

func newRunIndex(clock func() time.Duration, grace time.Duration) *runIndex {
	return &runIndex{clock: clock, m: map[string]*runState{}, specs: map[string]protocol.RunRecord{}, ended: map[string]protocol.RunRecord{},
		specRevs: map[string]uint64{}, expiring: map[string]*runsExpiry{}, started: time.Now(), grace: grace}
}

// keepEnded files rec, a run the watch saw settled (size bytes as stored),
// in x.ended, dropping the oldest past the bounds. x.mu is held.
func (x *runIndex) keepEnded(rec protocol.RunRecord, size int) {
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
func (x *runIndex) endedKept() int { return len(x.endedOrder) - x.endedHead }

// endedRecord returns run id as the watch saw it settle, if it is still
// kept (keepEnded).
func (x *runIndex) endedRecord(id string) (protocol.RunRecord, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	rec, ok := x.ended[id]
	return rec, ok
}

// put applies brood_runs key's value e and returns how long after e's
// creation the server removes it (kvwatch.Watch): RunsTTL for a settled state or
// a spec given its lifetime, 0 for any other.
func (x *runIndex) put(key string, e jetstream.KeyValueEntry) time.Duration {
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
			return x.ttl
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
			return x.ttl
		}
		return 0
	default:
		x.expireLater(key, e.Revision())
		return 0
	}
}

// putState applies the state rec (decoded from e with err) of run id of
// provider under key. x.mu is held.
func (x *runIndex) putState(key, provider, id string, rec protocol.RunRecord, err error, e jetstream.KeyValueEntry) {
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

// forget drops run id from the index (a spec with no state: no run) and
// gives its spec a lifetime.
func (x *runIndex) forget(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if spec, ok := x.specs[id]; ok {
		x.expireSpec(spec, x.specRevs[id], "", 0, false)
	}
	delete(x.m, id)
	delete(x.specs, id)
	delete(x.specRevs, id)
}

func (x *runIndex) del(key string) {
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

// orphanJobs lists the settlements of orphaned records due now.
func (c *Coordinator) orphanJobs() []job {
	hasLease := func(r protocol.RunRecord) bool {
		l, ok := c.agents.get(r.ChildID, r.Provider) // a run's provider is its child's header's
		return ok && l.rec.RunID == r.RunID
	}
	var jobs []job
	for _, rec := range c.runs.orphans(hasLease, c.reg.Expired) {
		if !c.orphanDue(rec) {
			continue
		}
		rec := rec
		jobs = append(jobs, job{rec.ChildID, func(ctx context.Context) { c.settleOrphan(ctx, rec) }})
	}
	return jobs
}

// orphans returns the running records that stayed without a lease for their
// run for at least the host expiry by the observed clock, noting the first
// sighting of the others; hasLease reports whether a run's session holds a
// lease for it.
func (x *runIndex) orphans(hasLease func(protocol.RunRecord) bool, expired func(since time.Duration) bool) []protocol.RunRecord {
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

// orphanDue reports whether a leaseless running record is an orphan: its
// claimer stopped heartbeating (one never seen heartbeating counts as
// dead: the lease-less wait already lasted the host expiry), or, unclaimed,
// its start's budget (RequestBudget) and the host expiry passed since it
// was created.
func (c *Coordinator) orphanDue(rec protocol.RunRecord) bool {
	if rec.HostID == "" {
		return time.Since(time.UnixMilli(rec.CreatedAt)) > c.cfg.RequestBudget+c.cfg.HostExpiry
	}
	_, live, known := c.reg.HostKnown(rec.HostID)
	return !known || !live
}

// settleOrphan settles an orphaned record never started (see the top of
// this file), once the bucket's leader confirms it is still running with no
// lease for it.
//
// The record is read before the lease: its host holds the claim again once
// it holds the lease (store.HoldRun, a compare-and-set at the revision read
// here), so either that lands and this settlement's compare-and-set fails,
// or the lease was already there when it was read.
func (c *Coordinator) settleOrphan(ctx context.Context, seen protocol.RunRecord) {
	run, ok := c.orphanConfirmed(ctx, seen)
	if !ok {
		return
	}
	taken, ok := c.fenceOrphan(ctx, run.Value)
	if !ok {
		return
	}
	rec := neverStarted(run.Value, c.cfg.ID)
	if won, err := c.st.SettleRun(ctx, rec, run.Revision); err != nil || !won {
		if err != nil {
			c.log.Warn("orphaned run: settle; will retry", "run", rec.RunID, "err", err)
		}
		c.releaseOrphanLease(ctx, rec, taken)
		return
	}
	c.closeOrphanLog(ctx, rec, taken)
	defer c.releaseOrphanLease(ctx, rec, taken)
	c.settled(rec)
	c.log.Warn("settled a run left running without a lease", "run", rec.RunID, "session", rec.ChildID, "errorCode", rec.Result.ErrorCode)
	c.st.PublishRunEnd(rec, c.st.PublishRunNotice, func(err error) { c.log.Warn("orphaned run's notice not published", "run", rec.RunID, "err", err) })
	if rec.Mode == protocol.ModeContinuable {
		c.resumePending(ctx, rec.ChildID)
	}
}

// orphanConfirmed reads seen's record from the bucket's leader: ok when it
// is still running, claimed by the same host (or none), and that host is
// confirmed lost (hostLost). A record gone is forgotten: a spec whose state
// was never created is no run.
func (c *Coordinator) orphanConfirmed(ctx context.Context, seen protocol.RunRecord) (store.Record[protocol.RunRecord], bool) {
	run, err := c.st.RunLatest(ctx, seen.RunID)
	if errors.Is(err, store.ErrNotFound) {
		c.runs.forget(seen.RunID)
		return run, false
	}
	if err != nil || run.Value.State != protocol.RunRunning || run.Value.HostID != seen.HostID {
		return run, false // settled, claimed meanwhile, or unreadable: the next sweep looks again
	}
	if run.Value.HostID != "" && !c.hostLost(ctx, run.Value.HostID) {
		return run, false // its claimer heartbeats: it may still take the lease
	}
	return run, true
}

// fenceOrphan makes sure no claimer of rec can still start it: ok false
// leaves rec alone. A claimed one-shot run's host takes the session's lease
// beside its claim and holds the claim no more (internal/worker, startRun):
// the lease is the fence. The settlement creates it first, taken over by
// this replica (returned as taken), so that of this create and the
// claimer's exactly one lands: a claimer whose create is refused starts
// nothing, and a run whose claimer holds the lease is left to it. Any other
// record is left to the holder of a lease for its run, if there is one.
func (c *Coordinator) fenceOrphan(ctx context.Context, rec protocol.RunRecord) (taken *store.Record[protocol.AgentRecord], ok bool) {
	if rec.HostID != "" && rec.Mode == protocol.ModeOneShot {
		tomb := protocol.AgentRecord{
			SessionID: rec.ChildID, Kind: protocol.AgentOneShot, HostID: c.cfg.ID, TakenOverBy: c.cfg.ID, Epoch: 2,
			RunID: rec.RunID, Provider: rec.Provider, ParentSession: rec.ParentSession, Notify: rec.Notify, CreatedAt: store.NowMs(),
		}
		trev, err := c.st.CreateLease(ctx, tomb)
		if err != nil {
			// Refused: the claimer (or a takeover) holds the lease. An
			// outcome unknown is decided by the lease sweep: a lease taken
			// over by this replica is taken over again (holderDead).
			return nil, false
		}
		c.agents.observe(tomb, trev)
		return &store.Record[protocol.AgentRecord]{Value: tomb, Revision: trev}, true
	}
	l, err := c.st.LeaseLatest(ctx, rec.ChildID)
	switch {
	case err == nil && l.Value.RunID == rec.RunID:
		return nil, false // it has its lease: the lease's holder settles it
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return nil, false // the next sweep looks again
	}
	return nil, true
}

// neverStarted returns the orphan rec settled by replica `by` as never
// started: UNAVAILABLE when no instance claimed it, HOST_LOST when its
// claimer stopped heartbeating before it took the session's lease.
func neverStarted(rec protocol.RunRecord, by string) protocol.RunRecord {
	code, why := protocol.CodeUnavailable, "no instance claimed it and the coordinator that created it stopped before it settled it"
	if rec.HostID != "" {
		code, why = protocol.CodeHostLost, fmt.Sprintf("host %s claimed it and stopped heartbeating before it took the session's lease", rec.HostID)
	}
	rec.State, rec.SettledAt, rec.SettledBy, rec.NotStarted = protocol.RunSettled, store.NowMs(), by, true
	rec.Result = &protocol.SubagentResult{
		Output: []protocol.ContentBlock{}, StopReason: protocol.StopError, ErrorCode: code,
		Diagnostic: protocol.TruncateDiagnostic("the child was never started: " + why),
	}
	return rec
}

// closeOrphanLog fences the log of the orphan rec, settled: the log is
// touched only once the settlement won, since the claimer's hold
// (store.HoldRun, an epoch's) or its lease (a one-shot run's, held here as
// taken) then fails, so it writes nothing more. Fenced before, a claimer
// that had just held its claim lost its log under a live lease (and its run
// stayed running). A one-shot run's log is fenced (agent/takeover, or an
// open turn closed) before the lease taken here goes, so a claimer's lease
// create landing after that (sent before it paused) still finds its first
// append refused. An epoch's host writes nothing before the hold; a later
// epoch may hold the session's lease and write the log now, so it is left
// alone (make test's chaos seed: a resumed epoch's log fenced by the
// settlement of an earlier epoch orphaned by a killed worker), except a
// first epoch's descriptor, which the log must get to stay resumable.
func (c *Coordinator) closeOrphanLog(ctx context.Context, rec protocol.RunRecord, taken *store.Record[protocol.AgentRecord]) {
	if rec.HostID == "" || (rec.Mode != protocol.ModeOneShot && rec.Descriptor == nil) {
		return
	}
	held := c.noLaterEpoch(rec.ChildID, rec.RunID)
	if taken != nil {
		held = c.holding(*taken)
	}
	if _, err := c.closeInterrupted(ctx, rec.ChildID, protocol.TakeoverData{HostID: rec.HostID, By: c.cfg.ID}, rec.Descriptor, held); err != nil && !errors.Is(err, store.ErrNotFound) {
		c.log.Warn("orphaned run: its log was not closed", "run", rec.RunID, "err", err)
	}
}

// releaseOrphanLease releases the lease fenceOrphan took for rec (none:
// nothing to do); one not released is taken over again by the lease sweep.
func (c *Coordinator) releaseOrphanLease(ctx context.Context, rec protocol.RunRecord, taken *store.Record[protocol.AgentRecord]) {
	if taken == nil {
		return
	}
	if err := c.st.ReleaseLease(ctx, rec.ChildID, taken.Revision); err == nil {
		c.agents.del(store.LeaseKeyOf(taken.Value))
	} else {
		c.log.Warn("orphaned run: the lease taken to settle it was not released; the lease sweep takes it over again", "run", rec.RunID, "err", err)
	}
}
