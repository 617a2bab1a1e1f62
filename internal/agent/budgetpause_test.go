package agent

import (
	"context"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// refusingBudget refuses reservations BUDGET_EXHAUSTED until raised
// reports true, with the details as a client decodes them from JSON
// (raises a float64), and grants them after.
type refusingBudget struct {
	raised func() bool
}

func (b *refusingBudget) ReserveBudget(_ context.Context, r protocol.BudgetReserveRequest) (protocol.BudgetReserveReply, error) {
	if !b.raised() {
		e := protocol.BudgetExhausted("B1", protocol.BudgetLimitModelRequests, "model requests", 1, 1)
		e.Details = map[string]any{"budget": "B1", "limit": protocol.BudgetLimitModelRequests, "unit": "model requests", "value": 1.0, "usage": 1.0, "raises": 3.0}
		return protocol.BudgetReserveReply{}, e
	}
	return protocol.BudgetReserveReply{ReservationID: "res", Granted: r.Want}, nil
}

func (b *refusingBudget) SettleBudget(context.Context, protocol.BudgetSettleRequest) error {
	return nil
}

// approvingRequester answers every request approved as it opens, as
// requests.open does for a pause opened after a raise it did not see.
type approvingRequester struct {
	testutil.Requests
}

func (f *approvingRequester) OpenRequest(ctx context.Context, r protocol.RequestOpenRequest) (protocol.RequestRecord, error) {
	rec, err := f.Requests.OpenRequest(ctx, r)
	rec.State = protocol.RequestApproved
	rec.Answer = &protocol.RequestAnswer{State: protocol.RequestApproved, By: protocol.Answerer{Kind: protocol.AnswererUser}}
	return rec, err
}

// TestBudgetPauseNamesTheRaisesItSaw (issue 32): a continuable child's
// pause at its cap opens its budget request with the raise count its
// refusal named (budgetRaises), so a raise between the two answers it at
// once; a request answered as it opens continues the turn without a poll.
func TestBudgetPauseNamesTheRaisesItSaw(t *testing.T) {
	req := &approvingRequester{}
	reg, err := NewRegistry()
	must(t, err)
	a, err := New(Config{Tools: reg, Header: protocol.SessionHeader{ID: "S1", Cwd: t.TempDir(), Budgets: []string{"B1"}}, Credential: "cred", Log: &memLog{},
		Model: model.NewScripted(), Requests: req, Budget: &refusingBudget{raised: func() bool { return len(req.Opened()) > 0 }}, Continuable: true})
	must(t, err)
	start := time.Now()
	out := a.RunTurn(context.Background(), userInput("say done"))
	if out.Reason.Kind != protocol.TurnCompleted {
		t.Fatalf("outcome %+v; want the turn completed after the pause", out)
	}
	if opened := req.Opened(); len(opened) != 1 || opened[0].BudgetOf != "B1" || opened[0].BudgetRaises == nil || *opened[0].BudgetRaises != 3 {
		t.Fatalf("opened %+v; want one budget request of B1 naming 3 raises", opened)
	}
	if req.Reads() != 0 || time.Since(start) > 5*time.Second {
		t.Fatalf("%d polls of a request answered as it opened (%s)", req.Reads(), time.Since(start))
	}
}
