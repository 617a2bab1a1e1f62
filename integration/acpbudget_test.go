package integration

import (
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
	acpbridge "github.com/brood-dev/brood/services/acp-bridge"
)

// TestACPChildrenSpendOnTheirBudgets (issue 32, items 2 and 5): an ACP
// child reserves its turn (one model request) on the budgets it draws on
// before its prompt and settles it after: the tokens its agent reported,
// or the whole grant when it reported none (unknown, never zero). Each
// start counts one child. At the modelRequests cap the next ACP child's
// prompt is refused BUDGET_EXHAUSTED before its agent is started; at the
// children cap the next start is refused.
func TestACPChildrenSpendOnTheirBudgets(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	o := acpTestOptions(t)
	o.Budget = s.Client
	ps, err := acpbridge.Providers([]acpbridge.AgentConfig{{Name: "fake", Command: fakeAgent(t)}}, o)
	if err != nil {
		t.Fatal(err)
	}
	s.AddHost(ps...)
	root := budgetRoot(t, s, &protocol.Budget{ModelRequests: 2, Children: 3})

	// Reported usage: 10 in, 5 out.
	_, res, err := s.Run(root.Ref(), "fake", "usage 10 5", protocol.StartOptions{})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("the first ACP child: %+v, %v", res, err)
	}
	if rec := ledger(t, s, root.SessionID); rec.Charged != (protocol.BudgetSpend{Tokens: 15, ModelRequests: 1, Children: 1}) || len(rec.Reservations) != 0 {
		t.Fatalf("after a turn that reported its usage the ledger is %+v, want 15 tokens, 1 request, 1 child charged", rec)
	}
	// No usage reported: the grant is charged, one token per two bytes of
	// the prompt plus the answer's bound.
	prompt := "echo hi"
	_, res, err = s.Run(root.Ref(), "fake", prompt, protocol.StartOptions{})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("the second ACP child: %+v, %v", res, err)
	}
	grant := int64(len(prompt))/2 + 4096
	if rec := ledger(t, s, root.SessionID); rec.Charged != (protocol.BudgetSpend{Tokens: 15 + grant, ModelRequests: 2, Children: 2}) || len(rec.Reservations) != 0 {
		t.Fatalf("after a turn of unknown usage the ledger is %+v, want %d tokens, 2 requests, 2 children charged", rec, 15+grant)
	}
	// At the modelRequests cap: the third child's prompt is refused before
	// its agent starts.
	began := time.Now()
	run, res, err := s.Run(root.Ref(), "fake", "echo again", protocol.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.StopReason != protocol.StopError || res.ErrorCode != protocol.CodeBudgetExhausted {
		t.Fatalf("the third ACP child: %+v, want error BUDGET_EXHAUSTED", res)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Fatalf("the refusal took %s", took)
	}
	_, evs := s.Log(run.ChildID)
	if got, want := eventTypes(evs), "turn/start user/message subagent/descriptor turn/end"; got != want {
		t.Fatalf("the refused child's log %s, want %s (no agent started, no step)", got, want)
	}
	if rec := ledger(t, s, root.SessionID); rec.Charged.ModelRequests != 2 || rec.Charged.Children != 3 || len(rec.Reservations) != 0 {
		t.Fatalf("after the refusal the ledger is %+v, want 2 requests and 3 children charged", rec)
	}
	// At the children cap the start itself is refused.
	_, _, err = s.Run(root.Ref(), "fake", "echo more", protocol.StartOptions{})
	if protocol.CodeOf(err) != protocol.CodeBudgetExhausted {
		t.Fatalf("a fourth start = %v, want BUDGET_EXHAUSTED", err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return len(ledger(t, s, root.SessionID).Reservations) == 0 }, "nothing in flight")

	// A child whose own budget is the only one it draws on: its turn uses
	// the reservation the coordinator took at its admission, settled with
	// what the agent reported (not left to be charged in full).
	run, res, err = s.Run(s.Root().Ref(), "fake", "usage 3 2", protocol.StartOptions{Budget: &protocol.Budget{Tokens: 100}})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("the ACP child with its own budget: %+v, %v", res, err)
	}
	if h, _ := s.Log(run.ChildID); h.BudgetStartTokens == 0 {
		t.Fatal("no reservation was taken at admission; the case is not tested")
	}
	if rec := ledger(t, s, run.ChildID); rec.Charged != (protocol.BudgetSpend{Tokens: 5, ModelRequests: 1}) || len(rec.Reservations) != 0 {
		t.Fatalf("the child's own ledger is %+v, want 5 tokens and 1 request charged, nothing in flight", rec)
	}
}
