package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	acpbridge "github.com/brood-dev/brood/services/acp-bridge"
	"github.com/brood-dev/brood/services/coordinator"
)

// Issue 32, item 3: a deadline that passes cancels the subtree as a
// dispose does, and the results say so (docs/protocol.md §5.5, "Budgets":
// "At the deadline").

// deadlineStack is a stack with the coordinator addCoordinator starts, a
// spawn worker and an ACP bridge serving the fake agent as provider "fake".
func deadlineStack(t *testing.T, addCoordinator func(*stack.Stack)) *stack.Stack {
	t.Helper()
	s := stack.New(t)
	addCoordinator(s)
	s.AddSpawnWorker()
	ps, err := acpbridge.Providers([]acpbridge.AgentConfig{{Name: "fake", Command: fakeAgent(t)}}, realAgentOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	s.AddHost(ps...)
	return s
}

// startSlowACP starts an ACP child of root whose agent streams "partial"
// and then waits a minute: nothing of its own ends it at a budget's
// deadline (its bridge runs no model requests to reserve).
func startSlowACP(t *testing.T, s *stack.Stack, root *client.Root) *client.Run {
	t.Helper()
	run, err := s.Client.StartRun(t.Context(), protocol.RunStartRequest{Parent: root.Ref(), Provider: "fake", Prompt: protocol.Text("slow 60s")})
	if err != nil {
		t.Fatalf("start the ACP child: %v", err)
	}
	return run
}

// deadlineEnded waits (at most 20 s) for run's result and checks it says
// the deadline: error, BUDGET_EXHAUSTED, and its turn/end likewise.
func deadlineEnded(t *testing.T, s *stack.Stack, run *client.Run) protocol.SubagentResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	res, err := run.Result(ctx)
	if err != nil {
		t.Fatalf("the result of %s: %v", run.ChildID, err)
	}
	if res.StopReason != protocol.StopError || res.ErrorCode != protocol.CodeBudgetExhausted || !strings.Contains(res.Diagnostic, "deadline") {
		t.Fatalf("%s ended %+v, want error BUDGET_EXHAUSTED naming the deadline", run.ChildID, res)
	}
	_, evs := s.Log(run.ChildID)
	if r := acpTurnEnd(t, evs); r.Kind != protocol.TurnError || r.Code != protocol.CodeBudgetExhausted {
		t.Fatalf("%s's turn/end %+v, want error BUDGET_EXHAUSTED", run.ChildID, r)
	}
	return res
}

// TestBudgetDeadlineEndsTheSubtree: a root's budget of 2.5 s over an ACP
// child whose agent waits a minute and a one-shot child blocked on a
// grandchild that sleeps: at the deadline every one of them ends, each
// result error BUDGET_EXHAUSTED naming the deadline — the ACP child too,
// which nothing of its own would have ended — the ledger records that its
// subtree was ended, and nothing starts under it any more.
func TestBudgetDeadlineEndsTheSubtree(t *testing.T) {
	s := deadlineStack(t, func(s *stack.Stack) { s.AddCoordinator() })
	const deadline = 2500 * time.Millisecond
	began := time.Now()
	root := budgetRoot(t, s, &protocol.Budget{DeadlineMs: deadline.Milliseconds()})
	acpChild := startSlowACP(t, s, root)
	o, err := s.Client.StartRun(t.Context(), protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn",
		Prompt: protocol.Text(delegate(t, "g", "sleep 60s\nsay late", false) + "\nsay child done")})
	if err != nil {
		t.Fatal(err)
	}
	res := deadlineEnded(t, s, acpChild)
	if protocol.PlainText(res.Output) != "partial" {
		t.Fatalf("the ACP child's output %q, want its partial answer", protocol.PlainText(res.Output))
	}
	deadlineEnded(t, s, o)
	if took := time.Since(began); took < deadline {
		t.Fatalf("the children ended after %s, before their deadline", took)
	}
	var g protocol.LifecycleEvent
	testutil.Eventually(t, 10*time.Second, func() bool {
		for _, ev := range s.Lifecycle(o.ChildID) {
			if ev.Type == protocol.LifecycleEnd {
				g = ev
				return true
			}
		}
		return false
	}, "the grandchild's end")
	if g.StopReason != protocol.StopError || g.ErrorCode != protocol.CodeBudgetExhausted {
		t.Fatalf("the grandchild ended %s %s, want error BUDGET_EXHAUSTED", g.StopReason, g.ErrorCode)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return ledger(t, s, root.SessionID).DeadlineEndedAt != 0 },
		"the ledger records its subtree ended")
	_, err = s.Client.StartContinuable(t.Context(), protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "late", Prompt: protocol.Text("say late")})
	if protocol.CodeOf(err) != protocol.CodeBudgetExhausted {
		t.Fatalf("a start after the deadline = %v, want BUDGET_EXHAUSTED", err)
	}
}

// TestBudgetDeadlineOutlivesACoordinatorRestart: the coordinator that
// created the ledger (and armed its deadline's timer) stops before the
// deadline; a replica started afterwards finds the deadline in the ledger
// on its sweep and ends the subtree.
func TestBudgetDeadlineOutlivesACoordinatorRestart(t *testing.T) {
	var stopFirst func()
	s := deadlineStack(t, func(s *stack.Stack) { _, stopFirst = s.StartCoordinator() })
	const deadline = 3 * time.Second
	root := budgetRoot(t, s, &protocol.Budget{DeadlineMs: deadline.Milliseconds()})
	acpChild := startSlowACP(t, s, root)
	stopFirst()
	if rec := ledger(t, s, root.SessionID); time.Now().UnixMilli() >= rec.DeadlineAt {
		t.Fatalf("the first coordinator stopped after the deadline (%d); the test needs it before", rec.DeadlineAt)
	}
	s.AddCoordinator(func(c *coordinator.Config) { c.BudgetDeadlineSweepInterval = 250 * time.Millisecond })
	deadlineEnded(t, s, acpChild)
	testutil.Eventually(t, 10*time.Second, func() bool { return ledger(t, s, root.SessionID).DeadlineEndedAt != 0 },
		"the ledger records its subtree ended")
}
