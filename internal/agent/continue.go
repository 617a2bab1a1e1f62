package agent

import (
	"context"
	"sync"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/protocol"
)

// A one-shot run outlives its host (docs/protocol.md §8.4, "Continued
// after a host loss"; issue 31, item 2). When the host of a run dies in
// the middle of its turn, a coordinator takes the session's lease at the
// next epoch and fences its log (agent/takeover) without closing the
// turn; another live instance of the provider then takes the lease and
// continues the turn from the log. What the log holds is never done again:
// each completed step stays as it is. The model request that was in flight
// (its step was not logged) is sent again. A step whose tool calls were
// logged without their results gets them: an Idempotent tool is run again,
// any other gets an error result saying that the call was interrupted by a
// host loss and may or may not have taken effect, so the model decides.

// InterruptedByHostLoss is the text of the error result a continued turn
// gives a call that was logged without its result and whose tool is not
// Idempotent: "%s" is the tool's name.
const InterruptedByHostLoss = "%s was interrupted: its host stopped (" + protocol.CauseHostLost + ") after the call was logged and before its result was; it may or may not have taken effect, and it is not run again (check its effect before you call it again)"

// ContinueTurn continues the turn the session's log left open when its
// host died and runs it to its end, within a new turn time limit
// (Limits.TurnTimeout), as RunSteps would have: a turn parked on a
// request continues as ContinueParked does; an open step's calls without
// a result get one (an Idempotent tool's call run again, in parallel,
// within a tool reservation of the session's budget; any other call
// InterruptedByHostLoss), logged with the step's end as one record; then
// the turn's next steps run, the first of them sending again the model
// request the dead host had in flight. With no open turn it returns the
// zero Outcome and logs nothing.
func (a *Agent) ContinueTurn(ctx context.Context) Outcome {
	if a.ParkedTurn() {
		return a.ContinueParked(ctx)
	}
	a.mu.Lock()
	turn, open, _, stepOpen, pending := sessionlog.OpenTurn(a.events)
	step := lastStepOf(a.events, turn)
	if open {
		a.turn = turn
	}
	a.mu.Unlock()
	if !open {
		return Outcome{}
	}
	a.log.Info("continuing a turn its host left open", "turn", turn, "step", step, "stepOpen", stepOpen, "calls", len(pending))
	ctx, cancel := context.WithTimeoutCause(ctx, a.limits.TurnTimeout, errTurnTimeout)
	defer cancel()
	if stepOpen {
		calls, results := a.continueCalls(ctx, pending)
		if out, done := a.logStepResults(ctx, turn, step, calls, results); done {
			return out
		}
	}
	return a.stepsFrom(ctx, turn, step+1, nil)
}

// continueCalls gives each call of pending (an open step's calls without a
// result, in log order) its result: an Idempotent tool's call runs again
// (in parallel, within one reservation of the session's budget, refused
// as a step's tools are when it is not granted), any other call gets
// InterruptedByHostLoss.
func (a *Agent) continueCalls(ctx context.Context, pending []protocol.ToolCallData) ([]protocol.ToolCall, []ToolResult) {
	calls := make([]protocol.ToolCall, len(pending))
	results := make([]ToolResult, len(pending))
	var again []int
	for i, p := range pending {
		calls[i] = protocol.ToolCall{ID: p.CallID, Name: p.Name, Arguments: p.Arguments}
		if t, ok := a.cfg.Tools.Lookup(p.Name); ok && t.Idempotent {
			again = append(again, i)
			continue
		}
		results[i] = ErrorResult(InterruptedByHostLoss, p.Name)
	}
	tg, err := a.reserveTools(ctx, len(again))
	if err != nil {
		reason := budgetEnd(err)
		for _, i := range again {
			results[i] = ErrorResult("%s: not run again after a host loss: %s", reason.Code, reason.Error)
		}
		return calls, results
	}
	var wg sync.WaitGroup
	for _, i := range again {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = a.runTool(ctx, pending[i].Turn, pending[i].Step, calls[i], nil)
		}()
	}
	wg.Wait()
	a.settle(ctx, tg, protocol.BudgetSpend{ToolCalls: int64(len(again))})
	return calls, results
}

// lastStepOf returns the number of the last step/start of turn in events
// (0 when the turn has none yet: its opening is all the log holds of it).
func lastStepOf(events []protocol.SessionEvent, turn int64) int64 {
	for i := len(events) - 1; i >= 0; i-- {
		switch events[i].Type {
		case protocol.EvTurnStart:
			return 0
		case protocol.EvStepStart:
			var d protocol.StepData
			if events[i].Decode(&d) == nil && d.Turn == turn {
				return d.Step
			}
		}
	}
	return 0
}
