package agent

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/pkg/protocol"
)

// History rebuilds the model conversation from a session log: user messages,
// assistant messages (tool calls and reasoning content exactly as logged) and
// tool results. Log-only events never reach the model.
func History(events []protocol.SessionEvent) ([]model.Message, error) {
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
			msgs = append(msgs, model.Message{
				Role: model.RoleAssistant, Content: d.Message.Content,
				ToolCalls: d.Message.ToolCalls, ReasoningContent: d.Message.ReasoningContent,
			})
		case protocol.EvToolResult:
			var d protocol.ToolResultData
			if err := ev.Decode(&d); err != nil {
				return nil, fmt.Errorf("event %d: %w", ev.Seq, err)
			}
			msgs = append(msgs, model.Message{
				Role: model.RoleTool, Content: d.Content, ToolCallID: d.CallID, Name: d.Name, IsError: d.IsError,
			})
		}
	}
	return msgs, nil
}

// DecodeJSONValue decodes JSON text into a plain value whose integers keep
// their exact values (int64/uint64) instead of becoming float64.
func DecodeJSONValue(text string) (any, error) {
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("trailing data after the JSON value")
	}
	return protocol.NormalizeNumbers(v), nil
}
