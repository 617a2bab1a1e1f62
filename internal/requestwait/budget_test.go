package requestwait

import (
	"errors"
	"strings"
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// TestBudgetPausePieces: a refusal pauses only when it is BUDGET_EXHAUSTED
// on a limit a raise lifts; the pause's request names the refusal's
// ledger and message and counts the step's earlier pauses; its answer
// says whether the turn reserves again, and why not.
func TestBudgetPausePieces(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"model requests spent", protocol.BudgetExhausted("b1", protocol.BudgetLimitModelRequests, "requests", 1, 1), true},
		{"tokens spent", protocol.BudgetExhausted("b1", protocol.BudgetLimitTokens, "tokens", 10, 10), true},
		{"the deadline", protocol.BudgetExhausted("b1", protocol.BudgetLimitDeadline, "milliseconds", 10, 11), false},
		{"another code", protocol.Errorf(protocol.CodeUnavailable, "no coordinator"), false},
		{"no typed error", errors.New("BUDGET_EXHAUSTED"), false},
		{"nil", nil, false},
	} {
		if got := PausesAtCap(tt.err); got != tt.want {
			t.Errorf("%s: PausesAtCap = %v, want %v", tt.name, got, tt.want)
		}
	}
	refused := protocol.BudgetExhausted("b1", protocol.BudgetLimitModelRequests, "requests", 1, 1)
	req := BudgetRequest(3, 2, 1, refused)
	if req.Kind != protocol.RequestBudget || req.Turn != 3 || req.Step != 2 || req.CallID != "budget-t3-s2-2" || req.BudgetOf != "b1" || req.Exhausted != refused.Message {
		t.Fatalf("BudgetRequest = %+v", req)
	}
	open := func(turn, step int64) protocol.SessionEvent {
		ev, _ := protocol.NewEvent(protocol.EvRequestOpen, 1, protocol.RequestOpenData{RequestID: "r", Kind: protocol.RequestBudget, Turn: turn, Step: step})
		return ev
	}
	start, _ := protocol.NewEvent(protocol.EvTurnStart, 1, protocol.TurnData{Turn: 3})
	if n := BudgetRequests([]protocol.SessionEvent{open(3, 2), start, open(3, 2), open(3, 1), open(3, 2)}, 3, 2); n != 2 {
		t.Fatalf("BudgetRequests = %d, want the 2 of the last turn's step 2", n)
	}
	user := protocol.Answerer{Kind: protocol.AnswererUser}
	if raised, _ := BudgetPauseEnd("spent", "r", protocol.RequestAnswerData{State: protocol.RequestApproved}); !raised {
		t.Fatal("an approval does not raise")
	}
	if raised, diag := BudgetPauseEnd("spent", "r", protocol.RequestAnswerData{State: protocol.RequestDenied, By: user, Reason: "no"}); raised || !strings.Contains(diag, "spent; the pause for a raise (request r) ended denied by the user: no") {
		t.Fatalf("a denial: %v %q", raised, diag)
	}
	if raised, diag := BudgetPauseEnd("spent", "r", protocol.RequestAnswerData{State: protocol.RequestTimedOut}); raised || !strings.Contains(diag, "none came in time") {
		t.Fatalf("a timeout: %v %q", raised, diag)
	}
}
