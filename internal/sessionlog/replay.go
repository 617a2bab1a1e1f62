package sessionlog

import (
	"fmt"

	"github.com/brood-dev/brood/pkg/protocol"
)

// CompletedPrefix returns the length of the balanced completed-turn prefix of
// a log: every event up to and including its last turn/end, or 0 when no turn
// ended (docs/upstream-behaviour.md §3.6). Everything after it, notably an in-flight
// turn and its open tool calls, is excluded.
func CompletedPrefix(events []protocol.SessionEvent) int {
	for i := len(events) - 1; i >= 0; i-- {
		if events[i].Type == protocol.EvTurnEnd {
			return i + 1
		}
	}
	return 0
}

// ValidateReplay checks the invariants a log must keep to be replayed or used
// as a seed: seqs contiguous from 0; turns balanced and never nested; steps
// balanced inside their turn; every tool call answered by exactly one result
// in the same turn, and no result without its call; tool-call ids unique in
// the whole session (the runtime records them so, see CallIDs: a model
// conversation may not repeat one). open allows the last turn to be still
// running.
func ValidateReplay(events []protocol.SessionEvent, open bool) error {
	inTurn, inStep := false, false
	var turn int64
	calls := map[string]bool{}
	used := map[string]int64{} // every call id of the session → its turn
	for i, ev := range events {
		if ev.Seq != int64(i) {
			return fmt.Errorf("event %d has seq %d: seqs must be contiguous from 0", i, ev.Seq)
		}
		switch ev.Type {
		case protocol.EvTurnStart:
			if inTurn {
				return fmt.Errorf("event %d: turn/start inside turn %d", i, turn)
			}
			var d protocol.TurnData
			if err := ev.Decode(&d); err != nil {
				return fmt.Errorf("event %d: %w", i, err)
			}
			inTurn, turn = true, d.Turn
		case protocol.EvTurnEnd:
			if !inTurn || inStep {
				return fmt.Errorf("event %d: turn/end without an open turn, or inside a step", i)
			}
			for id, answered := range calls {
				if !answered {
					return fmt.Errorf("event %d: turn %d ended with tool call %s unanswered", i, turn, id)
				}
			}
			inTurn, calls = false, map[string]bool{}
		case protocol.EvStepStart:
			if !inTurn || inStep {
				return fmt.Errorf("event %d: step/start outside a turn or inside a step", i)
			}
			inStep = true
		case protocol.EvStepEnd:
			if !inStep {
				return fmt.Errorf("event %d: step/end without an open step", i)
			}
			inStep = false
		case protocol.EvToolCall:
			var d protocol.ToolCallData
			if err := ev.Decode(&d); err != nil {
				return fmt.Errorf("event %d: %w", i, err)
			}
			if !inStep {
				return fmt.Errorf("event %d: tool/call outside a step", i)
			}
			if t, dup := used[d.CallID]; dup {
				return fmt.Errorf("event %d: tool call id %s used twice (turns %d and %d)", i, d.CallID, t, turn)
			}
			calls[d.CallID], used[d.CallID] = false, turn
		case protocol.EvToolResult:
			var d protocol.ToolResultData
			if err := ev.Decode(&d); err != nil {
				return fmt.Errorf("event %d: %w", i, err)
			}
			answered, ok := calls[d.CallID]
			if !ok || answered {
				return fmt.Errorf("event %d: tool/result %s without its call, or twice", i, d.CallID)
			}
			calls[d.CallID] = true
		}
	}
	if inTurn && !open {
		return fmt.Errorf("turn %d never ended", turn)
	}
	return nil
}
