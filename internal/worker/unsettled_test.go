package worker

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
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

// TestUnsettledKeepsWhatIsStillRefused: in a round where one settlement
// lands and the next is still refused, the landed one leaves and the refused
// one keeps waiting: the next round tries it again (and only it).
func TestUnsettledKeepsWhatIsStillRefused(t *testing.T) {
	var u unsettled
	var refuseB atomic.Bool
	refuseB.Store(true)
	var a, b atomic.Int32
	u.add("A", func(context.Context) bool { a.Add(1); return true })
	u.add("B", func(context.Context) bool { b.Add(1); return !refuseB.Load() })
	round := func() {
		t.Helper()
		u.retry(slog.Default())
		testutil.Eventually(t, 30*time.Second, func() bool {
			u.mu.Lock()
			defer u.mu.Unlock()
			return !u.busy
		}, "retry round did not finish")
	}
	round()
	u.mu.Lock()
	order := append([]string(nil), u.order...)
	u.mu.Unlock()
	if a.Load() != 1 || b.Load() != 1 || len(order) != 1 || order[0] != "B" {
		t.Fatalf("after A landed and B was refused: A tried %d, B tried %d, waiting %v; want B alone", a.Load(), b.Load(), order)
	}
	refuseB.Store(false)
	round()
	if a.Load() != 1 || b.Load() != 2 || len(u.order) != 0 || len(u.pending) != 0 {
		t.Fatalf("the next round: A tried %d, B tried %d, %d waiting; want B tried again and nothing left", a.Load(), b.Load(), len(u.order))
	}
}
