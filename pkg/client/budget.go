package client

import (
	"context"

	"github.com/brood-dev/brood/pkg/protocol"
)

// ReserveBudget reserves req.Want on every budget the session req.Self
// draws on (budget.reserve, docs/protocol.md §5.22; req.Self is its
// session id and live credential), before a model request (tokens, at
// least req.TokensMin, and one request) or a step's tool calls. The reply's
// ReservationID settles it (SettleBudget); "" when the session draws on no
// budget. Errors: BUDGET_EXHAUSTED (details budget, limit, unit, value,
// usage), UNAUTHORIZED, INVALID_ARGUMENT, UNAVAILABLE.
func (c *Client) ReserveBudget(ctx context.Context, req protocol.BudgetReserveRequest) (protocol.BudgetReserveReply, error) {
	var r protocol.BudgetReserveReply
	err := c.Call(ctx, protocol.EpBudgetReserve, req, &r)
	return r, err
}

// SettleBudget settles a reservation (budget.settle): req.Used is charged
// to every budget that holds it, the rest released. Settling again charges
// nothing more. Errors: UNAUTHORIZED (not the credential that reserved it),
// INVALID_ARGUMENT, UNAVAILABLE.
func (c *Client) SettleBudget(ctx context.Context, req protocol.BudgetSettleRequest) error {
	return c.Call(ctx, protocol.EpBudgetSettle, req, &protocol.Empty{})
}

// Budget reads the ledgers child childID draws on (budget.get,
// docs/protocol.md §5.5), root-most first, with auth its exact live
// parent's credential or a user grant over its tree. Errors: UNAUTHORIZED
// (a sibling, a stranger), NOT_FOUND, INVALID_ARGUMENT (a root),
// UNAVAILABLE.
func (c *Client) Budget(ctx context.Context, childID string, auth protocol.Authority) (protocol.BudgetGetReply, error) {
	var r protocol.BudgetGetReply
	err := c.Call(ctx, protocol.EpBudgetGet, protocol.BudgetGetRequest{ChildID: childID, Authority: auth}, &r)
	return r, err
}

// RaiseBudget raises child childID's own budget by raise (budget.raise,
// docs/protocol.md §5.5, "Pause and raise"), authorised as a followup
// (its exact live parent's credential, or a user grant over its tree); a
// parent raises at most to its own remainder. The child's paused turn, if
// any, continues: the reply names the budget requests answered. Errors:
// UNAUTHORIZED (a sibling, a stranger), INVALID_ARGUMENT (a raise naming
// nothing, a negative or huge amount, a limit the budget does not name, a
// child without a budget of its own), LIMIT_EXCEEDED (above the parent's
// remainder), NOT_FOUND, UNAVAILABLE.
func (c *Client) RaiseBudget(ctx context.Context, childID string, auth protocol.Authority, raise protocol.BudgetSpend) (protocol.BudgetRaiseReply, error) {
	var r protocol.BudgetRaiseReply
	err := c.Call(ctx, protocol.EpBudgetRaise, protocol.BudgetRaiseRequest{ChildID: childID, Authority: auth, Raise: raise}, &r)
	return r, err
}
