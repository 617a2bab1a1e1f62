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
