package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestBudgetCapEndsPromptlyBehindASettledRunsReservation (issue 32, item
// 3, "at the cap, pause, never hang"; docs/protocol.md §5.5, "The
// reservation rule"): a budget's tokens are held by a reservation of a run
// that settled long ago (its host died before it settled it) and by
// nobody else. A one-shot child drawing on it nests a grandchild whose
// steps reach the cap: no model request waits agent.BudgetWaitMax for
// those tokens (the coordinator sweeps the dead run's reservation before
// it decides to answer retryMs, and does not count the asking session's
// own); the run ends, BUDGET_EXHAUSTED or completed, within a few seconds,
// and the ledger ends charged at most its limit with nothing in flight. A
// continuable child on such a budget pauses at its cap as promptly.
func TestBudgetCapEndsPromptlyBehindASettledRunsReservation(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	for i, continuable := range []bool{false, true} {
		name := map[bool]string{false: "a one-shot chain ends", true: "a continuable child pauses"}[continuable]
		t.Run(name, func(t *testing.T) { capBehindSettledRun(t, s, i, continuable) })
	}
}

// capBehindSettledRun runs a child under a root whose budget a dead run's
// reservation mostly holds: a one-shot chain must end, a continuable
// child drawing on the same budget must pause, within a few
// seconds.
func capBehindSettledRun(t *testing.T, s *stack.Stack, i int, continuable bool) {
	const limit = 6000
	root := budgetRoot(t, s, &protocol.Budget{Tokens: limit})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// A run that settled long ago and left a reservation of most of the
	// budget's tokens on its ledger.
	dead := fmt.Sprintf("deadrunholdingtokens0000000%d", i)
	run := protocol.RunRecord{RunID: dead, ChildID: dead, ParentSession: root.SessionID, Provider: "spawn", Mode: protocol.ModeOneShot,
		State: protocol.RunRunning, CreatedAt: store.NowMs()}
	rev, err := s.Store.CreateRun(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	settled := store.Settled(run, "gone", protocol.SubagentResult{StopReason: protocol.StopError, ErrorCode: protocol.CodeHostLost})
	settled.SettledAt -= (time.Minute).Milliseconds()
	if ok, err := s.Store.SettleRun(ctx, settled, rev); !ok || err != nil {
		t.Fatalf("settle the dead run: %v, %v", ok, err)
	}
	got, err := s.Store.Budget(ctx, root.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	rec := got.Value
	rec.Reservations = append(rec.Reservations, protocol.BudgetReservation{ID: fmt.Sprintf("01JDEADRESERVATION0000000%d", i), SessionID: dead, RunID: dead,
		Spend: protocol.BudgetSpend{Tokens: limit - 300, ModelRequests: 1}, At: store.NowMs()})
	if _, err := s.Store.WriteBudget(ctx, root.SessionID, rec, got.Revision); err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	if continuable {
		start, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "capped",
			Prompt: protocol.Text(listSteps(30, "done"))})
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 20*time.Second, func() bool {
			st, err := s.Client.State(ctx, protocol.ChildRef{ChildID: start.ChildID, Authority: s.Grant()})
			return err == nil && st.State == protocol.StatePaused
		}, "the continuable child paused at its cap")
		if took := time.Since(began); took > 5*time.Second {
			t.Fatalf("the child took %s to pause at its cap; a model request waited for tokens only a settled run held", took)
		}
		t.Logf("paused after %s", time.Since(began))
		return
	}
	child := delegate(t, "g1", listSteps(30, "grandchild done"), false) + "\nsay child done"
	_, res, err := s.Run(root.Ref(), "spawn", child, protocol.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	if res.ErrorCode != protocol.CodeBudgetExhausted && res.StopReason != protocol.StopCompleted {
		t.Fatalf("result %+v; want completed or BUDGET_EXHAUSTED", res)
	}
	if took > 5*time.Second {
		t.Fatalf("the run took %s to end at its cap; a model request waited for tokens only a settled run held", took)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		rec = ledger(t, s, root.SessionID)
		return len(rec.Reservations) == 0
	}, "every reservation settled or swept")
	if rec.Charged.Tokens > limit {
		t.Fatalf("ledger %+v charged past its limit", rec)
	}
	t.Logf("result %s %s after %s; ledger %+v", res.StopReason, res.ErrorCode, took, rec.Charged)
}
