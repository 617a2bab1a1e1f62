package agent

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/brood-dev/brood/pkg/protocol"
)

// CallIDs hands out tool-call ids that are unique in one session (issue 14,
// repeated ids). Models may number calls `call_0` in every step, or give two
// parallel calls one id; a history with a repeated id is refused by strict
// servers and by ValidateReplay (so a fork of it would fail). The runtime
// therefore records every call under a session-unique id: the model's own id
// when it is new, else that id with the smallest suffix `_2`, `_3`, … that is
// new. The call, its tool/call event and its result all carry the recorded
// id, so they stay consistent; tool/call keeps the model's id in modelCallId
// when it differs. Not safe for concurrent use.
type CallIDs struct{ used map[string]bool }

// NewCallIDs returns the ids already used by events (tool calls of assistant
// messages and tool/call events, a fork seed included). Index.CallIDs keeps
// the same set as events are added.
func NewCallIDs(events []protocol.SessionEvent) *CallIDs {
	c := &CallIDs{used: map[string]bool{}}
	for _, ev := range events {
		switch ev.Type {
		case protocol.EvToolCall:
			var d protocol.ToolCallData
			if ev.Decode(&d) == nil {
				c.used[d.CallID] = true
			}
		case protocol.EvAssistantMessage:
			var d protocol.AssistantMessageData
			if ev.Decode(&d) == nil {
				for _, tc := range d.Message.ToolCalls {
					c.used[tc.ID] = true
				}
			}
		}
	}
	return c
}

// Unique returns id, or a new id derived from it when id (or "") was used
// before, and records it as used.
func (c *CallIDs) Unique(id string) string {
	if id == "" {
		id = "call"
	}
	out := id
	for n := 2; c.used[out]; n++ {
		out = fmt.Sprintf("%s_%d", id, n)
	}
	c.used[out] = true
	return out
}

// ReplayArguments is the form of a tool call's arguments sent back to a model
// in a later request: the raw text when it is a JSON object, else "{}"
// (empty arguments, or text that is not a JSON object, which strict servers
// refuse with HTTP 400). The log keeps the raw text; the call's error result
// quotes it (issue 14, invalid tool arguments).
func ReplayArguments(raw string) string {
	if argsObject(raw) {
		return raw
	}
	return "{}"
}

// argsObject reports whether raw is one JSON object, with only JSON white
// space (space, tab, CR, LF; RFC 8259 §2) around it: what a tool's strict
// decoder and a strict server accept. Unicode spaces such as U+00A0 are not
// JSON white space.
func argsObject(raw string) bool {
	return strings.HasPrefix(strings.TrimLeft(raw, " \t\r\n"), "{") && json.Valid([]byte(raw))
}

// argsError is the error result of a call whose arguments are not a JSON
// object: nothing was run, and the model sees what it sent (cut to 200 bytes).
func argsError(c protocol.ToolCall) ToolResult {
	raw := c.Arguments
	const shown = 200
	if len(raw) > shown {
		cut := shown
		for cut > 0 && !isRuneStart(raw[cut]) {
			cut--
		}
		raw = raw[:cut] + "…"
	}
	why := "they are not a JSON object"
	if err := json.Unmarshal([]byte(c.Arguments), new(any)); err != nil {
		why = "they are not valid JSON: " + err.Error()
	}
	return ErrorResult("%s: invalid arguments: %s; nothing was run. You sent: %s\nCall %s again with its arguments as one JSON object.",
		c.Name, why, strings.ReplaceAll(raw, "\n", " "), c.Name)
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
