package coordinator

// What the replica caches of brood_agents and BROOD_SESSIONS
// (docs/architecture.md §6): the leases with their indexes by parent and
// host (agentIndex, fed by the agents watch, kvwatch.Watch), the session
// headers and the continuable children's descriptors (bounded maps, read
// through on a miss). The hosts are hostreg.Registry; the running runs are
// runindex.Index.

import (
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// leaseState is one lease as this coordinator last saw it.
type leaseState struct {
	rec protocol.AgentRecord
	rev uint64
	// observedAt is when a direct read put the lease here (observe), zero
	// once the watch delivered it: see observedLeaseTrust.
	observedAt time.Time
	firstSeen  time.Time
	// firstObs is the registry's observed clock when the lease was first
	// seen: a holder never seen heartbeating is judged from then.
	firstObs time.Duration
}

// agentIndex caches brood_agents (leases): credentials for authority checks,
// and the sessions of each host and each parent for takeovers and disposal.
type agentIndex struct {
	mu sync.Mutex
	// byKey holds the leases by brood_agents key (store.LeaseKeyOf), drains
	// the drain markers by scope: removed when their key is deleted (a run
	// or epoch ended, a drain lifted); bound: the live sessions (each holds
	// at most one lease) and the drains in force.
	byKey  map[string]*leaseState
	drains map[string]protocol.DrainRecord
	// ended holds the sessions whose lease this replica saw and then saw
	// deleted (a run settled, an epoch ended), until a lease of theirs
	// appears again: their live-children slot is free at once (slots.go).
	// endedRuns holds the run ids of those leases: a resumed epoch's slot
	// names its run, and is free once that run's lease went.
	ended     map[string]bool
	endedRuns map[string]bool
	// gone holds, per lease key whose delete the watch applied, the
	// revision of the lease it held, until a lease is put under that key
	// again: a direct read that raced the delete (Store.Lease answered
	// by a follower that had not applied it yet, or answered just before
	// it) is older, and observe must not put it back. Nothing would ever
	// remove it again (its delete was applied), and the child would look
	// resident for good: a followup to it not resumed, the liveness sweep
	// skipping it, its message pending with no log line (chaos seed 4, L1).
	// Bound: endedMax, then it starts over.
	gone map[string]uint64
	now  func() time.Time // time.Now; a test's clock
	// byParent indexes byKey by the leases' parent session (parent → keys;
	// a parent leaves with its last lease, so it holds no more than byKey),
	// so counting one parent's live children reads that parent's leases
	// only: with 10,000 children resident, a start that copied every lease
	// took 9.4 ms instead of 1.4 (make bench-scale).
	byParent map[string]map[string]struct{}
	// requests holds the request records (request.<id>) by id, each at the
	// revision last seen, so the parked sweep walks them without listing
	// the bucket's keys (a listing is a consumer created and deleted, per
	// replica, every sweep); bound: the records the bucket holds (each
	// lives a day past its deadline or answer, store.RequestTTL), removed
	// when deleted or lapsed.
	requests map[string]uint64
	// budgetPauses indexes the pending budget requests (paused turns) by
	// the ledgers whose raise answers them, the asker's own and its
	// budgetOf (resumeBudgetPauses): ledger → request ids; pauseLedgers
	// is its reverse. Bound: the pending budget requests the bucket holds
	// (one per paused turn).
	budgetPauses map[string]map[string]struct{}
	pauseLedgers map[string][2]string
	// deadlines holds the budget ledgers (budget.<id>) with a deadline
	// whose subtree was not ended yet, by id: the deadline (epoch ms), so
	// the deadline sweep walks them without listing the bucket's keys
	// (deadlines.go); bound: the ledgers the bucket holds.
	deadlines map[string]int64
	// queued holds the parents whose start queue has entries
	// (startqueue.go), from the watched records; queueChanged, when set, is
	// called (without a.mu) when one changes or a child of such a parent
	// ends: the queue may admit its next start.
	queued       map[string]bool
	queueChanged func()
	// queuedRuns indexes the queued starts by run id and by child id
	// (id → parent session), and queuedRunsOf each queue's ids as last
	// seen, from the watched start queues: a run or continuable child
	// still queued is found by its id alone (loadRun with a user grant,
	// continuable.state). Bound: twice the entries the queues hold
	// (StartQueueMax per parent).
	queuedRuns   map[string]string
	queuedRunsOf map[string][]string
	// leftQueue maps the child id of a queued start whose run id is not
	// its child id (a continuable start, a remote run) to that run id once
	// its entry left the queue (admitted, or settled never started): a
	// start disposed in its queue has a run record (settled never started)
	// under its run id only, which loadRun finds by the child id through
	// here. Bound: endedMax, then it starts over; lost with the replica
	// (the child id is NOT_FOUND again then, the run id still answers).
	leftQueue map[string]string
	// queueEntries holds each queue's entries as last seen: {run id,
	// child id}. Bound: the entries the queues hold.
	queueEntries map[string][][2]string
	clock        func() time.Duration // the registry's observed clock
	// belongs checks a child's lease seen under key against its session's
	// header (store.LeaseBelongs); nil: only the key is checked.
	belongs func(key string, rec protocol.AgentRecord) error
	log     *slog.Logger
}

// setLease stores l under key and keeps byParent in step; a.mu is held.
func (a *agentIndex) setLease(key string, l *leaseState) {
	if old, ok := a.byKey[key]; ok {
		a.unindex(key, old.rec.ParentSession)
	}
	a.byKey[key] = l
	if p := l.rec.ParentSession; p != "" {
		keys := a.byParent[p]
		if keys == nil {
			keys = map[string]struct{}{}
			a.byParent[p] = keys
		}
		keys[key] = struct{}{}
	}
}

// unindex removes key from parent's entry of byParent; a.mu is held.
func (a *agentIndex) unindex(key, parent string) {
	if keys := a.byParent[parent]; keys != nil {
		delete(keys, key)
		if len(keys) == 0 {
			delete(a.byParent, parent)
		}
	}
}

// childrenOf returns the cached leases whose parent session is parent.
func (a *agentIndex) childrenOf(parent string) []leaseState {
	a.mu.Lock()
	defer a.mu.Unlock()
	keys := a.byParent[parent]
	out := make([]leaseState, 0, len(keys))
	for k := range keys {
		out = append(out, *a.byKey[k])
	}
	return out
}

// endedMax bounds agentIndex.ended; past it the set starts over, which only
// lets the slots of the forgotten sessions wait out their grace.
const endedMax = 100_000

func newAgentIndex(clock func() time.Duration, belongs func(string, protocol.AgentRecord) error, log *slog.Logger) *agentIndex {
	return &agentIndex{byKey: map[string]*leaseState{}, drains: map[string]protocol.DrainRecord{},
		ended: map[string]bool{}, endedRuns: map[string]bool{}, gone: map[string]uint64{}, now: time.Now, byParent: map[string]map[string]struct{}{}, queued: map[string]bool{}, queuedRuns: map[string]string{}, queuedRunsOf: map[string][]string{}, leftQueue: map[string]string{}, queueEntries: map[string][][2]string{}, requests: map[string]uint64{}, budgetPauses: map[string]map[string]struct{}{}, pauseLedgers: map[string][2]string{}, deadlines: map[string]int64{}, clock: clock, belongs: belongs, log: log}
}

// leaseHeaderWait bounds the header read that checks a child's lease the
// index sees for the first time (or naming another provider or parent than
// the last it saw under that key).
const leaseHeaderWait = 2 * time.Second

// hasEnded reports whether session id's lease was seen and then deleted,
// with no lease since.
func (a *agentIndex) hasEnded(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ended[id]
}

// hasEndedRun reports whether a lease of run runID was seen and then deleted.
func (a *agentIndex) hasEndedRun(runID string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.endedRuns[runID]
}

// put applies brood_agents key's value e. Of its keys a user grant and a
// request record lapse by themselves (store.CreateGrant's and
// store.CreateRequest's TTLs): put returns the time from e's creation to
// its expiry, plus the second the stores round up (kvwatch.Watch).
func (a *agentIndex) put(key string, e jetstream.KeyValueEntry) time.Duration {
	kind, id := store.KindOf(key)
	switch kind {
	case store.KindRequest:
		rec, err := store.Decode[protocol.RequestRecord](e)
		a.mu.Lock()
		a.requests[id] = e.Revision()
		a.unindexPause(id)
		if err == nil && rec.Kind == protocol.RequestBudget && rec.State == protocol.RequestPending {
			a.indexPause(id, [2]string{rec.SessionID, rec.BudgetOf})
		}
		a.mu.Unlock()
		return requestLapse(rec, err, e)
	case store.KindBudget:
		rec, err := store.Decode[protocol.BudgetRecord](e)
		a.mu.Lock()
		if err == nil && rec.DeadlineAt > 0 && rec.DeadlineEndedAt == 0 {
			a.deadlines[id] = rec.DeadlineAt
		} else {
			delete(a.deadlines, id)
		}
		a.mu.Unlock()
		return 0
	case store.KindDrain:
		if rec, err := store.Decode[protocol.DrainRecord](e); err == nil {
			a.mu.Lock()
			a.drains[id] = rec
			a.mu.Unlock()
		}
		return 0
	case store.KindGrant:
		if rec, err := store.Decode[protocol.UserGrantRecord](e); err == nil && rec.ExpiresAt > 0 {
			return max(time.UnixMilli(rec.ExpiresAt).Sub(e.Created()), 0) + time.Second
		}
		return 0
	case store.KindStartQueue:
		if rec, err := store.Decode[protocol.StartQueueRecord](e); err == nil {
			a.indexQueue(id, rec.Entries)
			a.setQueued(id, len(rec.Entries) > 0)
		}
		return 0
	case store.KindLease, store.KindRootLease:
	default:
		return 0 // ownership and slot records are read directly when needed
	}
	a.addLease(key, id, kind, e)
	return 0
}

// addLease applies the lease e under key (of session id, kind KindLease or
// KindRootLease).
func (a *agentIndex) addLease(key, id string, kind store.AgentsKind, e jetstream.KeyValueEntry) {
	rec, err := store.Decode[protocol.AgentRecord](e)
	if err != nil {
		a.log.Warn("undecodable agent record", "session", key, "err", err)
		return
	}
	// A root's lease lives only under its root key, which only coordinators
	// write, and a child's under its provider's prefix, which only that
	// provider's workers write; a lease elsewhere (naming a root, another
	// session or another provider) is not that session's (docs/security.md).
	if key != store.LeaseKeyOf(rec) {
		a.log.Warn("a lease under another key ignored", "key", key, "session", rec.SessionID, "kind", rec.Kind, "provider", rec.Provider)
		return
	}
	// A child's lease must also agree with its session's header, which only
	// coordinators write: a worker may write its own provider's leases, and
	// what it writes there for a session of another provider, or naming
	// another parent (counted against that parent's live children,
	// disposed with its tree), is no lease. A header that cannot be read
	// now is no evidence: the lease is kept (readers that act on one lease
	// read it again, checked, from the store).
	a.mu.Lock()
	old, seen := a.byKey[key]
	a.mu.Unlock()
	if a.belongs != nil && kind == store.KindLease && (!seen || old.rec.Provider != rec.Provider || old.rec.ParentSession != rec.ParentSession) {
		if err := a.belongs(key, rec); errors.Is(err, store.ErrMisfiledLease) {
			a.log.Warn("a lease its session's header disowns ignored", "key", key, "err", err)
			a.mu.Lock()
			if old, ok := a.byKey[key]; ok {
				delete(a.byKey, key)
				a.unindex(key, old.rec.ParentSession)
			}
			a.mu.Unlock()
			return
		} else if err != nil {
			a.log.Warn("a lease kept unchecked: its session's header could not be read", "key", key, "err", err)
		}
	}
	obs := a.clock()
	a.mu.Lock()
	defer a.mu.Unlock()
	l := &leaseState{rec: rec, rev: e.Revision(), firstSeen: time.Now(), firstObs: obs}
	if old, ok := a.byKey[key]; ok {
		l.firstSeen, l.firstObs = old.firstSeen, old.firstObs
	}
	a.setLease(key, l)
	delete(a.ended, id)
	delete(a.gone, key)
}

// deleted applies the watch's delete of key (del), remembering the
// revision of the lease it held (gone), so that a direct read of that
// lease which raced the delete does not put it back (observe). The
// coordinator's own del calls (a takeover, a fresh read forced) are not
// the bucket's word that the lease is gone: they leave no such mark.
func (a *agentIndex) deleted(key string) {
	a.mu.Lock()
	if old, ok := a.byKey[key]; ok {
		if len(a.gone) >= endedMax {
			a.gone = map[string]uint64{}
		}
		a.gone[key] = old.rev
	}
	a.mu.Unlock()
	a.del(key)
}

// del forgets the lease (or drain marker) under brood_agents key key
// (store.LeaseKeyOf of a lease), as a watched delete does.
func (a *agentIndex) del(key string) {
	kind, id := store.KindOf(key)
	if kind == store.KindStartQueue {
		a.indexQueue(id, nil)
		a.setQueued(id, false)
		return
	}
	kickQueue := false
	defer func() {
		if kickQueue && a.queueChanged != nil {
			a.queueChanged()
		}
	}()
	a.mu.Lock()
	switch kind {
	case store.KindDrain:
		delete(a.drains, id)
	case store.KindRequest:
		delete(a.requests, id)
		a.unindexPause(id)
	case store.KindBudget:
		delete(a.deadlines, id)
	case store.KindLease, store.KindRootLease:
		old, ok := a.byKey[key]
		if !ok {
			break
		}
		delete(a.byKey, key)
		a.unindex(key, old.rec.ParentSession)
		if len(a.ended) >= endedMax {
			a.ended = map[string]bool{}
		}
		if len(a.endedRuns) >= endedMax {
			a.endedRuns = map[string]bool{}
		}
		a.ended[id] = true
		kickQueue = a.queued[old.rec.ParentSession]
		if old.rec.RunID != "" {
			a.endedRuns[old.rec.RunID] = true
		}
	}
	a.mu.Unlock()
}

// setQueued records whether parent's start queue has entries.
func (a *agentIndex) setQueued(parent string, has bool) {
	a.mu.Lock()
	if has {
		a.queued[parent] = true
	} else {
		delete(a.queued, parent)
	}
	a.mu.Unlock()
	if has && a.queueChanged != nil {
		a.queueChanged()
	}
}

// indexQueue records the run and child ids of parent's queued starts
// (entries, as its start queue holds them now) in queuedRuns.
func (a *agentIndex) indexQueue(parent string, entries []protocol.QueuedStart) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, runID := range a.queuedRunsOf[parent] {
		if a.queuedRuns[runID] == parent {
			delete(a.queuedRuns, runID)
		}
	}
	for _, e := range a.queueEntries[parent] {
		if e[0] != e[1] && a.queuedRuns[e[1]] == "" {
			if len(a.leftQueue) >= endedMax {
				a.leftQueue = map[string]string{}
			}
			a.leftQueue[e[1]] = e[0]
		}
	}
	delete(a.queueEntries, parent)
	if len(entries) == 0 {
		delete(a.queuedRunsOf, parent)
		return
	}
	ids := make([]string, 0, len(entries))
	for _, e := range entries {
		ids = append(ids, e.RunID)
		if e.ChildID != e.RunID {
			ids = append(ids, e.ChildID) // a remote run's, or a continuable start's child
		}
	}
	for _, id := range ids {
		a.queuedRuns[id] = parent
	}
	a.queuedRunsOf[parent] = ids
	pairs := make([][2]string, 0, len(entries))
	for _, e := range entries {
		pairs = append(pairs, [2]string{e.RunID, e.ChildID})
		delete(a.leftQueue, e.ChildID) // queued again
	}
	a.queueEntries[parent] = pairs
}

// leftQueueRun returns the run id of the start of child childID last seen
// leaving a start queue, when its run id is not childID, or "".
func (a *agentIndex) leftQueueRun(childID string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.leftQueue[childID]
}

// queuedParentOf returns the parent in whose start queue a start of run
// (or child) id was last seen waiting, or "".
func (a *agentIndex) queuedParentOf(id string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.queuedRuns[id]
}

// hasQueue reports whether parent's start queue had entries when last seen.
func (a *agentIndex) hasQueue(parent string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.queued[parent]
}

// queuedParents returns the parents whose start queue has entries.
func (a *agentIndex) queuedParents() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.queued))
	for p := range a.queued {
		out = append(out, p)
	}
	return out
}

// drainMarks returns the drain markers in force (scope → record).
func (a *agentIndex) drainMarks() map[string]protocol.DrainRecord {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]protocol.DrainRecord, len(a.drains))
	for k, v := range a.drains {
		out[k] = v
	}
	return out
}

// get returns the cached lease of session id of scope (its header's,
// protocol.SessionHeader.Scope): a root's lease is read only from its root
// key, a child's only from its provider's.
func (a *agentIndex) get(id, scope string) (leaseState, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := store.LeaseKeyFor(id, scope)
	l, ok := a.byKey[key]
	if !ok {
		return leaseState{}, false
	}
	if !l.observedAt.IsZero() && a.now().Sub(l.observedAt) > observedLeaseTrust {
		// Read directly and never delivered by the watch since: the
		// watch may have missed its put and its delete both (it was
		// being opened again), and nothing else would remove it. The
		// caller reads the bucket instead.
		delete(a.byKey, key)
		a.unindex(key, l.rec.ParentSession)
		return leaseState{}, false
	}
	return *l, true
}

// observedLeaseTrust bounds how long a lease a direct read put in the
// index (observe) is taken from it before the watch delivers it too: the
// watch delivers a live lease within milliseconds, so one it has not
// delivered after this long was, most likely, put and deleted while the
// watch was being opened again (seen in chaos seed 3: a coordinator whose
// agents watch was down for seconds cached an epoch's lease from its
// agent's budget.reserve, the epoch ended meanwhile, and the child looked
// resident for good: its followups were not resumed, with no log line).
const observedLeaseTrust = 10 * time.Second

// observe stores a fresher lease read directly from the bucket.
func (a *agentIndex) observe(rec protocol.AgentRecord, rev uint64) {
	obs := a.clock()
	a.mu.Lock()
	defer a.mu.Unlock()
	l := &leaseState{rec: rec, rev: rev, firstSeen: time.Now(), firstObs: obs, observedAt: a.now()}
	key := store.LeaseKeyOf(rec)
	if old, ok := a.byKey[key]; ok {
		if old.rev >= rev {
			return
		}
		l.firstSeen, l.firstObs = old.firstSeen, old.firstObs
	}
	if g, ok := a.gone[key]; ok && rev <= g {
		return // deleted since: a read that raced the delete
	}
	a.setLease(key, l)
}

// snapshot returns every cached lease.
func (a *agentIndex) snapshot() []leaseState {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]leaseState, 0, len(a.byKey))
	for _, l := range a.byKey {
		out = append(out, *l)
	}
	return out
}
