package sessionlog

import "github.com/brood-dev/brood/pkg/protocol"

// ParkedCall is a call of a parked turn's open step that has no
// tool/result yet (Parked): Open is its request/open when the log has one
// (the call waited for an answer), Answer its request/answer when that was
// logged too (the answer came before the host died).
type ParkedCall struct {
	Call   protocol.ToolCallData
	Open   *protocol.RequestOpenData
	Answer *protocol.RequestAnswerData
}

// ParkedStep is the open step of a turn left parked on a request (Parked).
type ParkedStep struct {
	Turn, Step int64
	// Pending are the step's calls without a tool/result, in log order.
	Pending []ParkedCall
	// Budget, when set, is the budget request the turn is paused on
	// (docs/protocol.md §5.5, "Pause and raise"): before step Step's model
	// request (no step open, Pending empty), or before its logged tool
	// calls ran (Pending are those calls, none with a request of its own).
	Budget *protocol.RequestOpenData
}

// Parked reports the turn events leave open parked on a request
// (docs/protocol.md §5.21, "After a restart"): the last turn is open, its
// last step is open, and one of that step's calls without a tool/result
// has a request/open whose request/answer is not logged yet. Such a turn is
// continued from the log by the session's next activation rather than
// closed interrupted. ok is false for any other log (no open turn, or an
// open turn no request holds).
func Parked(events []protocol.SessionEvent) (p ParkedStep, ok bool) {
	turn, open, step, stepOpen, pending := OpenTurn(events)
	if open {
		if d := budgetPaused(events, turn); d != nil && (!stepOpen || (d.Step == step && len(pending) > 0)) {
			// Paused before step d.Step's model request (no step open), or
			// before its logged tool calls ran (the step open, its calls
			// without results).
			p := ParkedStep{Turn: turn, Step: d.Step, Budget: d}
			if stepOpen {
				for _, c := range pending {
					p.Pending = append(p.Pending, ParkedCall{Call: c})
				}
			}
			return p, true
		}
	}
	if !open || !stepOpen || len(pending) == 0 {
		return ParkedStep{}, false
	}
	byCall := map[string]int{}
	p = ParkedStep{Turn: turn, Step: step}
	for _, c := range pending {
		byCall[c.CallID] = len(p.Pending)
		p.Pending = append(p.Pending, ParkedCall{Call: c})
	}
	// The open turn's events: from its turn/start on.
	start := len(events) - 1
	for ; start > 0 && events[start].Type != protocol.EvTurnStart; start-- {
	}
	waiting := false
	for _, ev := range events[start:] {
		switch ev.Type {
		case protocol.EvRequestOpen:
			var d protocol.RequestOpenData
			if ev.Decode(&d) != nil {
				continue
			}
			if i, ok := byCall[d.CallID]; ok && d.Turn == turn && d.Step == step {
				p.Pending[i].Open = &d
			}
		case protocol.EvRequestAnswer:
			var d protocol.RequestAnswerData
			if ev.Decode(&d) != nil {
				continue
			}
			if i, ok := byCall[d.CallID]; ok {
				p.Pending[i].Answer = &d
			}
		}
	}
	for _, c := range p.Pending {
		waiting = waiting || (c.Open != nil && c.Answer == nil)
	}
	if !waiting {
		return ParkedStep{}, false
	}
	return p, true
}

// budgetPaused returns the budget request open turn turn is paused on: a
// request/open of kind budget with no request/answer of its request and
// no step/start after it (nor a tool/result: a step's calls ran); nil
// when there is none.
func budgetPaused(events []protocol.SessionEvent, turn int64) *protocol.RequestOpenData {
	start := len(events) - 1
	for ; start > 0 && events[start].Type != protocol.EvTurnStart; start-- {
	}
	var open *protocol.RequestOpenData
	for _, ev := range events[max(start, 0):] {
		switch ev.Type {
		case protocol.EvRequestOpen:
			var d protocol.RequestOpenData
			if ev.Decode(&d) == nil && d.Kind == protocol.RequestBudget && d.Turn == turn {
				open = &d
			}
		case protocol.EvRequestAnswer:
			var d protocol.RequestAnswerData
			if open != nil && ev.Decode(&d) == nil && d.RequestID == open.RequestID {
				open = nil
			}
		case protocol.EvStepStart, protocol.EvToolResult:
			open = nil
		}
	}
	return open
}
