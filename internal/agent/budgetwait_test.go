package agent

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/pkg/protocol"
)

// cappedBudget answers as a ledger at its cap whose other tokens are held
// by another session: ask again (retryMs) unless noWait, then
// BUDGET_EXHAUSTED. A settle waits for release, and a reserve sent while
// one is unfinished is counted.
type cappedBudget struct {
	mu       sync.Mutex
	asks     []bool // each ask's noWait
	settling int
	early    int // reserves sent while a settle was unfinished
	release  chan struct{}
}

func (b *cappedBudget) ReserveBudget(_ context.Context, r protocol.BudgetReserveRequest) (protocol.BudgetReserveReply, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.asks = append(b.asks, r.NoWait)
	if b.settling > 0 {
		b.early++
	}
	if !r.NoWait {
		return protocol.BudgetReserveReply{RetryMs: protocol.BudgetRetryMs}, nil
	}
	return protocol.BudgetReserveReply{}, protocol.BudgetExhausted("B1", protocol.BudgetLimitTokens, "tokens", 100, 100)
}

func (b *cappedBudget) SettleBudget(context.Context, protocol.BudgetSettleRequest) error {
	b.mu.Lock()
	b.settling++
	b.mu.Unlock()
	<-b.release
	b.mu.Lock()
	b.settling--
	b.mu.Unlock()
	return nil
}

// TestAStepAtTheCapWaitsOnceNotTwice (issue 32, item 3, "at the cap,
// pause, never hang"; docs/protocol.md §5.5, "The reservation rule"): a
// turn whose prefetched reservation was refused BUDGET_EXHAUSTED after its
// wait does not wait BudgetWaitMax again for its step: the step asks once
// without waiting and gets the refusal (then pauses or ends) at once. And
// a model request's reservation is sent only after the session's own
// settlements in flight ended: the coordinator does not tell a session to
// wait for its own reservations.
func TestAStepAtTheCapWaitsOnceNotTwice(t *testing.T) {
	b := &cappedBudget{release: make(chan struct{})}
	reg, err := NewRegistry()
	must(t, err)
	a, err := New(Config{Tools: reg, Header: protocol.SessionHeader{ID: "S1", Cwd: t.TempDir(), Budgets: []string{"B1"}}, Credential: "cred", Log: &memLog{},
		Model: model.NewScripted(), Budget: b})
	must(t, err)

	ch := make(chan prefetched, 1)
	ch <- prefetched{err: protocol.BudgetExhausted("B1", protocol.BudgetLimitTokens, "tokens", 100, 100)}
	a.prefetched = ch
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err = a.takeReservation(ctx, &model.Request{Messages: []model.Message{{Role: model.RoleUser, Content: []protocol.ContentBlock{{Type: protocol.BlockText, Text: "hi"}}}}})
	if protocol.CodeOf(err) != protocol.CodeBudgetExhausted || time.Since(start) > time.Second {
		t.Fatalf("the step's reservation after a refused prefetch: %v after %s; want BUDGET_EXHAUSTED within a second", err, time.Since(start))
	}
	b.mu.Lock()
	if len(b.asks) != 1 || !b.asks[0] {
		t.Fatalf("asks (noWait each) %v; want one ask without waiting", b.asks)
	}
	b.asks = nil
	b.mu.Unlock()

	// A settlement in flight holds the next reservation back until it ends.
	a.settle(ctx, grant{id: "r1", tokens: 50}, protocol.BudgetSpend{Tokens: 10, ModelRequests: 1})
	done := make(chan error, 1)
	go func() {
		_, err := a.reserveModelWait(ctx, &model.Request{}, false)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the reservation returned (%v) while the session's own settlement was in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(b.release)
	if err := <-done; protocol.CodeOf(err) != protocol.CodeBudgetExhausted {
		t.Fatalf("the reservation after the settlement: %v; want BUDGET_EXHAUSTED", err)
	}
	a.settles.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.early != 0 || len(b.asks) != 1 {
		t.Fatalf("%d reservations sent while a settlement was in flight, %d asks; want none early, one ask", b.early, len(b.asks))
	}
}
