package runindex

import (
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// The lifetimes of brood_runs' keys (services/coordinator/expiry.go has the
// rule and gives them): the index files the keys the watch delivers that a
// replica is to give a TTL, with their due time, and hands out those due.

// Expiry is one brood_runs key this replica is to give its lifetime.
type Expiry struct {
	Rev uint64 // the revision the compare-and-set names
	// Spec is set for a run's spec (store.ExpireRunSpec); nil for any other
	// key (store.ExpireRunsKey).
	Spec *protocol.RunRecord
	// State and StateRev name a settled state to give a TTL to first
	// (store.ExpireRunsKey): one written before this replica started.
	State    string
	StateRev uint64
	due      time.Time // before its rank's delay
	fails    int
}

// Bounds of the lifetime work.
const (
	// expiringMax bounds the keys one replica holds to expire; past it a
	// key is left to the next replica to start (its runs watch delivers
	// every key again).
	expiringMax = 1 << 20
	// ExpiryAttemptsMax bounds the failed attempts at one key (each within
	// the store's WriteBudget); past it the key is left to the next replica
	// to start.
	ExpiryAttemptsMax = 5
)

// expireSpec files spec (at rev), whose run is settled or was never
// created, to be given its lifetime at once; state and stateRev name its
// settled state when checkState (written before this replica started).
// x.mu is held.
func (x *Index) expireSpec(spec protocol.RunRecord, rev uint64, state string, stateRev uint64, checkState bool) {
	e := &Expiry{Rev: rev, Spec: &spec, due: time.Now()}
	if checkState {
		e.State, e.StateRev = state, stateRev
	}
	x.file(store.RunSpecKey(spec.Provider, spec.RunID), e)
}

// expireLater files key (at rev), covered by no run's lifetime, to be given
// one after x.grace. x.mu is held.
func (x *Index) expireLater(key string, rev uint64) {
	if e, ok := x.expiring[key]; ok && e.Spec == nil {
		e.Rev = rev // written again: its grace still runs from the first
		return
	}
	x.file(key, &Expiry{Rev: rev, due: time.Now().Add(x.grace)})
}

func (x *Index) file(key string, e *Expiry) {
	if len(x.expiring) >= expiringMax {
		if _, ok := x.expiring[key]; !ok {
			return // left to the next replica to start
		}
	}
	x.expiring[key] = e
}

// ExpiryDue lists at most `most` keys due now, delay(key) after their due
// time.
func (x *Index) ExpiryDue(now time.Time, delay func(key string) time.Duration, most int) map[string]Expiry {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[string]Expiry{}
	for key, e := range x.expiring {
		if len(out) >= most {
			break
		}
		if !now.Before(e.due.Add(delay(key))) {
			out[key] = *e
		}
	}
	return out
}

// ExpiryDone drops key from the keys to expire when it is still filed at
// rev; failed counts an attempt that failed instead, and drops the key past
// ExpiryAttemptsMax. It reports whether the key was dropped for good.
func (x *Index) ExpiryDone(key string, rev uint64, failed bool) (gaveUp bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	e, ok := x.expiring[key]
	if !ok || e.Rev != rev {
		return false
	}
	if failed {
		if e.fails++; e.fails < ExpiryAttemptsMax {
			return false
		}
		gaveUp = true
	}
	delete(x.expiring, key)
	return gaveUp
}
