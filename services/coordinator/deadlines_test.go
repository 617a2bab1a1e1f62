package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// TestTheDeadlineSweepListsNoKeys: the budget deadline sweep takes up the
// ledgers its replica's watch of brood_agents holds, creating no consumer
// (a key listing is one, per replica per sweep): a ledger written after
// the coordinator started, whose deadline passed, is marked ended by a
// sweep, and one whose deadline is still ahead is left alone.
func TestTheDeadlineSweepListsNoKeys(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.BudgetDeadlineSweepInterval = 50 * time.Millisecond })
	noConsumers := agentsConsumersCreated(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now().UnixMilli()
	passed, ahead := ulid.Make().String(), ulid.Make().String()
	for id, at := range map[string]int64{passed: now - 1000, ahead: now + 3_600_000} {
		rec := protocol.BudgetRecord{SessionID: id, Limits: protocol.Budget{DeadlineMs: 60_000}, DeadlineAt: at, CreatedAt: now - 60_000, WriteID: ulid.Make().String()}
		if _, err := s.Store.WriteBudget(ctx, id, rec, 0); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 20*time.Second, func() bool {
		r, err := s.Store.Budget(ctx, passed)
		return err == nil && r.Value.DeadlineEndedAt != 0
	}, "a sweep ends the subtree of the budget whose deadline passed")
	if r, err := s.Store.Budget(ctx, ahead); err != nil || r.Value.DeadlineEndedAt != 0 {
		t.Fatalf("the budget whose deadline is ahead: %+v, %v; want it untouched", r.Value, err)
	}
	noConsumers()
}
