package testutil

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
)

// ElectionLasts is how long an Election refuses writes: longer than the
// store's WriteBudget (the fixed budget a write had before issue 9's
// fixes), shorter than the budgets writes that must outlast an election
// have now (a caller's deadline of 30 s, worker.RunWriteBudget).
const ElectionLasts = store.WriteBudget + 2*time.Second

// Election answers the writes of a service's store that Match selects "no
// response from stream" (a stream or bucket without a leader:
// jetstream.ErrNoStreamResponse) from the first refusal on, for
// ElectionLasts, and lets them through after that: a leader election of
// one of Brood's streams or buckets on a loaded cluster (deploy
// TestLeaderElectionsAreNotFailures, issue 9). Give the service
// Store.WithFaults(e.Faults()); nothing is refused until Match is set.
type Election struct {
	mu    sync.Mutex
	match func(store.Write) bool // called under mu
	began time.Time              // the first refusal
	last  time.Time              // the last refusal
	n     int                    // refusals
}

// Match sets which writes the election refuses.
func (e *Election) Match(m func(store.Write) bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.match = m
}

// Faults is the hook to give the service's store.
func (e *Election) Faults() store.Faults {
	return store.Faults{Before: func(_ context.Context, w store.Write) error {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.match == nil || !e.match(w) {
			return nil
		}
		now := time.Now()
		if e.began.IsZero() {
			e.began = now
		}
		if now.Sub(e.began) >= ElectionLasts {
			return nil
		}
		e.last, e.n = now, e.n+1
		return jetstream.ErrNoStreamResponse
	}}
}

// Refusals is how many writes the election refused so far.
func (e *Election) Refusals() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n
}

// Check fails t unless writes were refused past the store's WriteBudget.
func (e *Election) Check(t testing.TB) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == 0 || e.last.Sub(e.began) < store.WriteBudget {
		t.Fatalf("the writes were refused %d times over %s; want the refusals to outlast the WriteBudget (%s)", e.n, e.last.Sub(e.began), store.WriteBudget)
	}
}
