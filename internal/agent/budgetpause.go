package agent

import (
	"context"

	"github.com/brood-dev/brood/internal/requestwait"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/protocol"
)

// A continuable child at its budget's cap pauses instead of ending
// (docs/protocol.md §5.5, "Pause and raise"; issue 32, item 3). When the
// reservation of a model request is refused BUDGET_EXHAUSTED on a limit
// that can be raised (tokens, model requests, tool calls, children; never
// the deadline), the turn opens a request of kind budget and parks on it
// as a tool call parks on an approval (park): request/open is logged
// inside the open turn, no step is open, and the turn holds no model
// connection and no reservation while it waits. A raise (budget.raise)
// answers the request approved and the turn reserves again, the same
// step of the same turn; a denial or the request's timeout ends the turn
// BUDGET_EXHAUSTED, as a one-shot's cap does; the budget's deadline
// passing meanwhile ends it with the deadline's reason. The pause is the
// log's (sessionlog.Parked, Budget): a host that dies while the turn is
// paused leaves the turn open, and the session's next activation waits on
// the same request (ContinueParked).

// pausesAtCap reports whether a refused reservation err pauses the turn
// rather than ending it: the session is a continuable child that may ask
// (Config.Continuable, Config.Requests), and the limit reached is one a
// raise lifts (requestwait.PausesAtCap).
func (a *Agent) pausesAtCap(err error) bool {
	return a.cfg.Continuable && a.cfg.Requests != nil && requestwait.PausesAtCap(err)
}

// budgetPause parks turn before step's model request on a budget request
// (parked, when set, is the one its previous host logged: the turn waits
// on it again) and reports whether the turn ended (out says how): not
// ended means the request was approved (a raise) and the step reserves
// again. refused is the reservation's BUDGET_EXHAUSTED (nil with parked).
//
// calls, when set, are the step's logged tool calls whose reservation was
// refused (a pause before they run, the step open): a turn that ends
// gives each an error result first, as refuseTools does.
func (a *Agent) budgetPause(ctx context.Context, turn, step int64, refused error, parked *protocol.RequestOpenData, calls []protocol.ToolCall) (Outcome, bool) {
	req := protocol.RequestOpenRequest{Kind: protocol.RequestBudget, Turn: turn, Step: step}
	if parked != nil {
		req.CallID = parked.CallID
	} else {
		a.mu.Lock()
		req = requestwait.BudgetRequest(turn, step, requestwait.BudgetRequests(a.events, turn, step), refused)
		a.mu.Unlock()
	}
	pause := &protocol.RequestOpenData{RequestID: protocol.RequestID(a.cfg.Header.ID, req.CallID), Kind: protocol.RequestBudget, Turn: turn, Step: step, CallID: req.CallID}
	defer func() {
		a.mu.Lock()
		a.paused = nil
		a.mu.Unlock()
	}()
	a.log.Info("the turn pauses at its budget's cap until the budget is raised", "turn", turn, "step", step, "request", pause.RequestID)
	rec, d, failed, err := a.park(ctx, turn, req, parked)
	exhausted := rec.Exhausted
	if exhausted == "" {
		exhausted = req.Exhausted
	}
	end := func(diag string) (Outcome, bool) {
		reason := errReason(protocol.CodeBudgetExhausted, diag)
		if len(calls) > 0 {
			return a.refuseToolsReason(ctx, turn, step, calls, reason), true
		}
		if ctx.Err() != nil {
			return a.endCancelled(ctx, turn, nil), true
		}
		return a.end(ctx, turn, nil, reason), true
	}
	switch {
	case failed == parkEnded && ctx.Err() != nil:
		return end("") // cancelled: endCancelled says how
	case failed != 0:
		return end(requestwait.BudgetPauseFailed(exhausted, pause.RequestID, err))
	}
	if raised, diag := requestwait.BudgetPauseEnd(exhausted, rec.ID, d); !raised {
		return end(diag)
	}
	a.log.Info("the budget was raised; the turn reserves again", "turn", turn, "step", step, "request", rec.ID)
	return Outcome{}, false
}

// reserveToolsPausing reserves a step's logged tool calls, pausing at the
// budget's cap as a model request does (budgetPause with calls); done
// reports the turn ended (out says how). parked, when set, is the pause
// its previous host logged: the step waits on it first.
func (a *Agent) reserveToolsPausing(ctx context.Context, turn, step int64, calls []protocol.ToolCall, parked *protocol.RequestOpenData) (g grant, out Outcome, done bool) {
	var err error
	if parked != nil {
		if out, done := a.budgetPause(ctx, turn, step, nil, parked, calls); done {
			return grant{}, out, true
		}
	}
	g, err = a.reserveTools(ctx, len(calls))
	for err != nil && ctx.Err() == nil && a.pausesAtCap(err) {
		if out, done := a.budgetPause(ctx, turn, step, err, nil, calls); done {
			return grant{}, out, true
		}
		g, err = a.reserveTools(ctx, len(calls))
	}
	if err != nil {
		return grant{}, a.refuseTools(ctx, turn, step, calls, err), true
	}
	return g, Outcome{}, false
}

// continueToolsPaused continues a step paused at its budget's cap before
// its logged tool calls ran (sessionlog.Parked: Budget and Pending): it
// waits on the same request, runs the calls once raised, and goes on with
// the turn's next steps.
func (a *Agent) continueToolsPaused(ctx context.Context, p sessionlog.ParkedStep) Outcome {
	ctx, cancelDeadline := a.withBudgetDeadline(ctx)
	defer cancelDeadline()
	defer a.turnSettled()
	calls := make([]protocol.ToolCall, len(p.Pending))
	for i, pc := range p.Pending {
		calls[i] = protocol.ToolCall{ID: pc.Call.CallID, Name: pc.Call.Name, Arguments: pc.Call.Arguments}
	}
	tg, out, done := a.reserveToolsPausing(ctx, p.Turn, p.Step, calls, p.Budget)
	if done {
		return out
	}
	results := a.runTools(ctx, p.Turn, p.Step, calls)
	a.settle(ctx, tg, protocol.BudgetSpend{ToolCalls: int64(len(calls))})
	if out, done := a.logStepResults(ctx, p.Turn, p.Step, calls, results); done {
		return out
	}
	return a.stepsFrom(ctx, p.Turn, p.Step+1, nil)
}

// notePaused shows the budget request d (once it is open and logged) as
// the one the running turn is paused on (BudgetPause); other kinds are
// not a pause.
func (a *Agent) notePaused(d protocol.RequestOpenData) {
	if d.Kind != protocol.RequestBudget {
		return
	}
	a.mu.Lock()
	a.paused = &d
	a.mu.Unlock()
}

// BudgetPause returns the budget request the running turn is paused on (a
// copy), nil when it is not paused at its budget's cap. Safe for
// concurrent use; continuable.state shows it as state paused
// (docs/protocol.md §5.10).
func (a *Agent) BudgetPause() *protocol.RequestOpenData {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.paused == nil {
		return nil
	}
	d := *a.paused
	return &d
}
