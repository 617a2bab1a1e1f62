package sessionlog

import (
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// TestParked: a log ends in a parked turn only when its last turn and step
// are open and a call without a result has a request/open whose answer is
// not logged (docs/protocol.md §5.21, "After a restart").
func TestParked(t *testing.T) {
	ts := protocol.TurnData{Turn: 2}
	st := protocol.StepData{Turn: 2, Step: 3}
	call := func(id string) any {
		return protocol.ToolCallData{Turn: 2, Step: 3, CallID: id, Name: "write_file"}
	}
	open := func(id string) any {
		return protocol.RequestOpenData{RequestID: "r-" + id, Kind: protocol.RequestApproval, Turn: 2, Step: 3, CallID: id, Tool: "write_file"}
	}
	answer := protocol.RequestAnswerData{RequestID: "r-a", CallID: "a", State: protocol.RequestApproved}
	result := protocol.ToolResultData{Turn: 2, Step: 3, CallID: "a", Name: "write_file"}
	head := []any{protocol.EvTurnStart, ts, protocol.EvStepStart, st, protocol.EvToolCall, call("a"), protocol.EvToolCall, call("b")}
	tests := []struct {
		name    string
		tail    []any
		parked  bool
		pending int
	}{
		{"no request", nil, false, 0},
		{"a call parked", []any{protocol.EvRequestOpen, open("a")}, true, 2},
		{"its answer logged", []any{protocol.EvRequestOpen, open("a"), protocol.EvRequestAnswer, answer}, false, 0},
		{"its result logged", []any{protocol.EvRequestOpen, open("a"), protocol.EvRequestAnswer, answer, protocol.EvToolResult, result}, false, 0},
		{"the other call still parked", []any{protocol.EvRequestOpen, open("a"), protocol.EvRequestOpen, open("b"), protocol.EvRequestAnswer, answer, protocol.EvToolResult, result}, true, 1},
		{"the turn closed", []any{protocol.EvRequestOpen, open("a"), protocol.EvStepEnd, st, protocol.EvTurnEnd, protocol.TurnEndData{Turn: 2}}, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, ok := Parked(seqd(t, append(append([]any(nil), head...), tt.tail...)...))
			if ok != tt.parked || len(p.Pending) != tt.pending {
				t.Fatalf("Parked = %+v, %v; want %v with %d pending", p, ok, tt.parked, tt.pending)
			}
			if ok && (p.Turn != 2 || p.Step != 3) {
				t.Fatalf("parked at turn %d step %d, want 2, 3", p.Turn, p.Step)
			}
		})
	}
}

// TestParkedAtBudget: a turn paused at its budget's cap (docs/protocol.md
// §5.5, "Pause and raise") is parked when its last budget request/open,
// logged with no step open, has no answer and no step started after it.
func TestParkedAtBudget(t *testing.T) {
	ts := protocol.TurnData{Turn: 2}
	st := protocol.StepData{Turn: 2, Step: 1}
	pause := func(n string) any {
		return protocol.RequestOpenData{RequestID: "r-" + n, Kind: protocol.RequestBudget, Turn: 2, Step: 2, CallID: "budget-t2-s2-" + n}
	}
	answer := func(n string) any {
		return protocol.RequestAnswerData{RequestID: "r-" + n, CallID: "budget-t2-s2-" + n, State: protocol.RequestApproved}
	}
	head := []any{protocol.EvTurnStart, ts, protocol.EvStepStart, st, protocol.EvStepEnd, st}
	tests := []struct {
		name   string
		tail   []any
		parked string // the request id it waits on; "" not parked
	}{
		{"no pause", nil, ""},
		{"paused", []any{protocol.EvRequestOpen, pause("1")}, "r-1"},
		{"raised", []any{protocol.EvRequestOpen, pause("1"), protocol.EvRequestAnswer, answer("1")}, ""},
		{"raised, paused again", []any{protocol.EvRequestOpen, pause("1"), protocol.EvRequestAnswer, answer("1"), protocol.EvRequestOpen, pause("2")}, "r-2"},
		{"raised, the step started", []any{protocol.EvRequestOpen, pause("1"), protocol.EvRequestAnswer, answer("1"), protocol.EvStepStart, protocol.StepData{Turn: 2, Step: 2}}, ""},
		{"the turn ended", []any{protocol.EvRequestOpen, pause("1"), protocol.EvTurnEnd, protocol.TurnEndData{Turn: 2}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, ok := Parked(seqd(t, append(append([]any(nil), head...), tt.tail...)...))
			got := ""
			if ok && p.Budget != nil {
				got = p.Budget.RequestID
			}
			if ok != (tt.parked != "") || got != tt.parked {
				t.Fatalf("Parked = %+v, %v; want parked on %q", p, ok, tt.parked)
			}
			if ok && (p.Turn != 2 || p.Step != 2 || len(p.Pending) != 0) {
				t.Fatalf("parked at turn %d step %d with %d pending, want 2, 2, none", p.Turn, p.Step, len(p.Pending))
			}
		})
	}
}

// TestParkedAtBudgetBeforeToolCalls: a step whose logged tool calls got no
// reservation pauses with the step open: it is parked on its budget
// request, the calls pending, until the request is answered or a call's
// result is logged.
func TestParkedAtBudgetBeforeToolCalls(t *testing.T) {
	ts := protocol.TurnData{Turn: 1}
	st := protocol.StepData{Turn: 1, Step: 1}
	call := func(id string) any {
		return protocol.ToolCallData{Turn: 1, Step: 1, CallID: id, Name: "read_file"}
	}
	pause := protocol.RequestOpenData{RequestID: "r-1", Kind: protocol.RequestBudget, Turn: 1, Step: 1, CallID: "budget-t1-s1-1"}
	answer := protocol.RequestAnswerData{RequestID: "r-1", CallID: "budget-t1-s1-1", State: protocol.RequestApproved}
	result := protocol.ToolResultData{Turn: 1, Step: 1, CallID: "a", Name: "read_file"}
	head := []any{protocol.EvTurnStart, ts, protocol.EvStepStart, st, protocol.EvToolCall, call("a"), protocol.EvToolCall, call("b")}
	tests := []struct {
		name    string
		tail    []any
		parked  bool
		pending int
	}{
		{"paused before its calls", []any{protocol.EvRequestOpen, pause}, true, 2},
		{"raised", []any{protocol.EvRequestOpen, pause, protocol.EvRequestAnswer, answer}, false, 0},
		{"a call ran", []any{protocol.EvRequestOpen, pause, protocol.EvToolResult, result}, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, ok := Parked(seqd(t, append(append([]any(nil), head...), tt.tail...)...))
			if ok != tt.parked || len(p.Pending) != tt.pending || (ok && (p.Budget == nil || p.Budget.RequestID != "r-1" || p.Step != 1)) {
				t.Fatalf("Parked = %+v, %v; want %v with %d pending", p, ok, tt.parked, tt.pending)
			}
		})
	}
}
