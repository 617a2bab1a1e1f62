package coordinator

import (
	"cmp"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// The request records, budget pauses and budget deadlines the agents watch
// indexes (agentIndex, caches.go): what the parked, raise and deadline
// sweeps read instead of listing keys.

// requestLapse is when a request record e lapses, counted from its
// creation: a pending one's TTL runs to a day past its deadline, an
// answered one's a day past the answer (store.RequestTTL); the later of
// the two, so a pending record is never forgotten early (one forgotten
// late is only read once more by the parked sweep and found gone).
func requestLapse(rec protocol.RequestRecord, err error, e jetstream.KeyValueEntry) time.Duration {
	lapse := store.RequestTTL
	if err == nil {
		lapse = max(lapse, time.UnixMilli(rec.Deadline).Add(store.RequestTTL).Sub(e.Created()))
	}
	return lapse + time.Second
}

// indexPause files pending budget request id under the ledgers of
// ledgers (budgetPauses); a.mu is held.
func (a *agentIndex) indexPause(id string, ledgers [2]string) {
	for _, l := range ledgers {
		if l == "" {
			continue
		}
		ids := a.budgetPauses[l]
		if ids == nil {
			ids = map[string]struct{}{}
			a.budgetPauses[l] = ids
		}
		ids[id] = struct{}{}
	}
	a.pauseLedgers[id] = ledgers
}

// unindexPause forgets request id in budgetPauses; a.mu is held.
func (a *agentIndex) unindexPause(id string) {
	ledgers, ok := a.pauseLedgers[id]
	if !ok {
		return
	}
	delete(a.pauseLedgers, id)
	for _, l := range ledgers {
		if ids := a.budgetPauses[l]; ids != nil {
			delete(ids, id)
			if len(ids) == 0 {
				delete(a.budgetPauses, l)
			}
		}
	}
}

// pausesOn returns the ids of the pending budget requests seen whose raise
// of ledger answers them (budgetPauses), sorted.
func (a *agentIndex) pausesOn(ledger string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	ids := make([]string, 0, len(a.budgetPauses[ledger]))
	for id := range a.budgetPauses[ledger] {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// requestRevisions returns the request records seen, by id (oldest id
// first: ids are ULIDs), with the revision last seen of each.
func (a *agentIndex) requestRevisions() (ids []string, revs []uint64) {
	a.mu.Lock()
	ids = make([]string, 0, len(a.requests))
	for id := range a.requests {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	revs = make([]uint64, len(ids))
	for i, id := range ids {
		revs[i] = a.requests[id]
	}
	a.mu.Unlock()
	return ids, revs
}

// dueDeadlines returns the budgets seen whose deadline passed at now and
// whose subtree was not ended, at most max, earliest deadline first.
func (a *agentIndex) dueDeadlines(now int64, max int) []string {
	a.mu.Lock()
	var ids []string
	for id, at := range a.deadlines {
		if at <= now {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(x, y string) int { return cmp.Compare(a.deadlines[x], a.deadlines[y]) })
	a.mu.Unlock()
	if len(ids) > max {
		ids = ids[:max]
	}
	return ids
}
