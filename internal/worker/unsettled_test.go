package worker

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

// TestUnsettledRetriesUntilJetStreamTakesTheWrite: a settlement whose budget
// ran out is tried again after each heartbeat JetStream took, stops at the
// first one JetStream still refuses (the rest wait for the next heartbeat),
// and leaves once it landed.
func TestUnsettledRetriesUntilJetStreamTakesTheWrite(t *testing.T) {
	var u unsettled
	var refuse atomic.Bool
	refuse.Store(true)
	var a, b atomic.Int32
	u.add("A", func(context.Context) bool { a.Add(1); return !refuse.Load() })
	u.add("B", func(context.Context) bool { b.Add(1); return true })
	idle := func() bool {
		u.mu.Lock()
		defer u.mu.Unlock()
		return !u.busy
	}
	wait := func() {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !idle(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("retry round did not finish")
			}
		}
	}
	u.retry(slog.Default())
	wait()
	if a.Load() != 1 || b.Load() != 0 || len(u.order) != 2 {
		t.Fatalf("after a refused round: A tried %d, B tried %d, %d waiting", a.Load(), b.Load(), len(u.order))
	}
	refuse.Store(false)
	u.retry(slog.Default())
	wait()
	if a.Load() != 2 || b.Load() != 1 || len(u.order) != 0 || len(u.pending) != 0 {
		t.Fatalf("after JetStream took the writes: A tried %d, B tried %d, %d waiting", a.Load(), b.Load(), len(u.order))
	}
	u.retry(slog.Default()) // nothing left: no round
	if !idle() {
		t.Fatal("a round started with nothing waiting")
	}
}
