package testutil

import (
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// TurnHistory returns the events of a session that talks to a model (an
// ACP editor's root, a fork parent), unwritten: each of completed turns a
// user message and an answer (6 events: its balanced completed-turn prefix
// grows by 6 a turn), then with inFlight a turn that called a tool and is
// still waiting (5 events past that prefix).
func TurnHistory(t testing.TB, completed int, inFlight bool) []protocol.SessionEvent {
	t.Helper()
	var evs []protocol.SessionEvent
	add := func(typ string, data any) {
		ev, err := protocol.NewEvent(typ, 1, data)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	for turn := int64(1); turn <= int64(completed); turn++ {
		add(protocol.EvTurnStart, protocol.TurnData{Turn: turn})
		add(protocol.EvUserMessage, protocol.UserMessageData{ID: "u", Turn: turn, Content: protocol.Text("question"), Source: protocol.MessageSource{Kind: protocol.SourceUser}})
		add(protocol.EvStepStart, protocol.StepData{Turn: turn, Step: 1})
		add(protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: turn, Step: 1, Message: protocol.AssistantMessage{Content: protocol.Text("the parent's answer")}})
		add(protocol.EvStepEnd, protocol.StepData{Turn: turn, Step: 1})
		add(protocol.EvTurnEnd, protocol.TurnEndData{Turn: turn, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}})
	}
	if inFlight {
		turn := int64(completed + 1)
		add(protocol.EvTurnStart, protocol.TurnData{Turn: turn})
		add(protocol.EvUserMessage, protocol.UserMessageData{ID: "v", Turn: turn, Content: protocol.Text("delegate please"), Source: protocol.MessageSource{Kind: protocol.SourceUser}})
		add(protocol.EvStepStart, protocol.StepData{Turn: turn, Step: 1})
		add(protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: turn, Step: 1, Message: protocol.AssistantMessage{
			Content: []protocol.ContentBlock{}, ToolCalls: []protocol.ToolCall{{ID: "c9", Name: "subagent", Arguments: `{}`}}}})
		add(protocol.EvToolCall, protocol.ToolCallData{Turn: turn, Step: 1, CallID: "c9", Name: "subagent", Arguments: `{}`})
	}
	return evs
}
