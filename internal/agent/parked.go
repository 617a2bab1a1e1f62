package agent

import (
	"context"
	"sync"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/protocol"
)

// A turn parked on a request survives its host (docs/protocol.md §5.21,
// "After a restart"; issue 33, item 1). When the host dies while a call
// waits for an answer, whoever takes the session over leaves the turn
// open (sessionlog.Parked), and the session's next activation continues
// it from the log: the completed steps and the results already logged are
// not redone, the waiting calls read their requests again and wait for
// the answers, and the turn goes on with its next model step. The tool of
// an approved call runs only after its request/answer is logged, by the
// one activation that holds the session's lease and its log's fence: it
// runs once, or not at all if its host dies after that append and before
// the tool/result's (then it is never run again, see continueCall).

// ParkedTurn reports whether the session's log ends in a turn parked on a
// request (sessionlog.Parked): ContinueParked continues it.
func (a *Agent) ParkedTurn() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := sessionlog.Parked(a.events)
	return ok
}

// ContinueParked continues the turn the log left parked on a request
// (ParkedTurn) and runs it to its end, within a new turn time limit
// (Limits.TurnTimeout): each call of the open step without a result gets
// one (continueCall), logged with the step's end as one record, and the
// turn's next steps run as RunSteps runs them. With no parked turn it
// returns the zero Outcome and logs nothing.
func (a *Agent) ContinueParked(ctx context.Context) Outcome {
	a.mu.Lock()
	p, ok := sessionlog.Parked(a.events)
	if ok {
		a.turn = p.Turn
	}
	a.mu.Unlock()
	if !ok {
		return Outcome{}
	}
	a.log.Info("continuing a turn parked on a request", "turn", p.Turn, "step", p.Step, "calls", len(p.Pending))
	ctx, cancel := context.WithTimeoutCause(ctx, a.limits.TurnTimeout, errTurnTimeout)
	defer cancel()
	switch {
	case p.Budget != nil && len(p.Pending) > 0:
		// Paused at its budget's cap before step p.Step's tool calls ran:
		// it waits on the same request, then runs them.
		return a.continueToolsPaused(ctx, p)
	case p.Budget != nil:
		// Paused at its budget's cap before step p.Step: it waits on the
		// same budget request, then reserves that step again.
		return a.stepsFrom(ctx, p.Turn, p.Step, p.Budget)
	}
	calls := make([]protocol.ToolCall, len(p.Pending))
	results := make([]ToolResult, len(p.Pending))
	var wg sync.WaitGroup
	for i, pc := range p.Pending {
		calls[i] = protocol.ToolCall{ID: pc.Call.CallID, Name: pc.Call.Name, Arguments: pc.Call.Arguments}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = a.continueCall(ctx, p.Turn, p.Step, calls[i], pc)
		}()
	}
	wg.Wait()
	if out, done := a.logStepResults(ctx, p.Turn, p.Step, calls, results); done {
		return out
	}
	return a.stepsFrom(ctx, p.Turn, p.Step+1, nil)
}

// continueCall returns the result of call c of a parked step, pc being what
// the log holds of it:
//   - parked and unanswered: the call waits for its request's answer
//     (runTool, parked), logs it, and runs or gets the denial, the timeout
//     or the question's answer, as before its host died;
//   - parked and answered before the host died: a denial, a timeout or a
//     question's answer is its result again; an approved call may have
//     run before the host died, so it is not run again: its result is an
//     error that says so;
//   - not parked (it ran beside the parked one, or its request was opened
//     but not logged): an error result saying it was interrupted, as the
//     closing of an open turn gives it (docs/protocol.md §8.4).
func (a *Agent) continueCall(ctx context.Context, turn, step int64, c protocol.ToolCall, pc sessionlog.ParkedCall) ToolResult {
	switch {
	case pc.Open == nil:
		return ErrorResult("the tool call was interrupted: its host stopped (%s) before its result was logged, and it is not run again", protocol.CauseHostLost)
	case pc.Answer == nil:
		return a.runTool(ctx, turn, step, c, pc.Open)
	case pc.Open.Kind == protocol.RequestQuestion:
		return askResult(pc.Open.RequestID, *pc.Answer)
	}
	if res, ok := approvalResult(c.Name, pc.Open.RequestID, *pc.Answer); !ok {
		return res
	}
	return ErrorResult("%s was approved (request %s), but its host stopped (%s) before its result was logged: it may have run, and it is not run again", c.Name, pc.Open.RequestID, protocol.CauseHostLost)
}
