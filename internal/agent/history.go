package agent

import (
	"fmt"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/pkg/protocol"
)

// History rebuilds the model conversation from a session log: user messages,
// assistant messages (tool calls and reasoning content as logged) and tool
// results. Log-only events never reach the model. What is sent back is a
// conversation every strict server accepts, whatever the log holds (issue 14):
//
//   - a tool call is replayed only with its result: a call the turn never ran
//     (an answer cut at the token limit, a step over the per-step call limit)
//     is left out of its message, and a result without a call (or a second
//     result for one call) is left out;
//   - a call's arguments go back as ReplayArguments gives them: "{}" when the
//     logged text is empty or not a JSON object (the log keeps the raw text).
//
// It decodes every message of events; a running agent reads the same
// conversation from its Index, kept as events are appended (Index.Messages).
func History(events []protocol.SessionEvent) ([]model.Message, error) {
	results := map[string]bool{}
	for _, ev := range events {
		if ev.Type == protocol.EvToolResult {
			var d protocol.ToolResultData
			if err := ev.Decode(&d); err != nil {
				return nil, fmt.Errorf("event %d: %w", ev.Seq, err)
			}
			results[d.CallID] = true
		}
	}
	called, answered := map[string]bool{}, map[string]bool{}
	var msgs []model.Message
	for _, ev := range events {
		switch ev.Type {
		case protocol.EvUserMessage:
			var d protocol.UserMessageData
			if err := ev.Decode(&d); err != nil {
				return nil, fmt.Errorf("event %d: %w", ev.Seq, err)
			}
			msgs = append(msgs, model.Message{Role: model.RoleUser, Content: d.Content})
		case protocol.EvAssistantMessage:
			var d protocol.AssistantMessageData
			if err := ev.Decode(&d); err != nil {
				return nil, fmt.Errorf("event %d: %w", ev.Seq, err)
			}
			var calls []protocol.ToolCall
			for _, c := range d.Message.ToolCalls {
				if !results[c.ID] || called[c.ID] {
					continue
				}
				called[c.ID] = true
				c.Arguments = ReplayArguments(c.Arguments)
				calls = append(calls, c)
			}
			msgs = append(msgs, model.Message{
				Role: model.RoleAssistant, Content: d.Message.Content,
				ToolCalls: calls, ReasoningContent: d.Message.ReasoningContent,
			})
		case protocol.EvToolResult:
			var d protocol.ToolResultData
			if err := ev.Decode(&d); err != nil {
				return nil, fmt.Errorf("event %d: %w", ev.Seq, err)
			}
			if !called[d.CallID] || answered[d.CallID] {
				continue
			}
			answered[d.CallID] = true
			msgs = append(msgs, model.Message{
				Role: model.RoleTool, Content: d.Content, ToolCallID: d.CallID, Name: d.Name, IsError: d.IsError,
			})
		}
	}
	return msgs, nil
}
