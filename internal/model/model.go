// Package model holds Brood's model adapters behind one interface: `scripted`
// (deterministic, no network; the default) and `openai` (any
// OpenAI-compatible chat-completions endpoint, DeepSeek by default). docs/design.md §5.
package model

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Roles of conversation messages.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Message is one conversation message as the runtime rebuilds it from the
// session log. Assistant messages carry ToolCalls and ReasoningContent exactly
// as logged; tool messages carry ToolCallID, Name and IsError.
type Message struct {
	Role             string
	Content          []protocol.ContentBlock
	ToolCalls        []protocol.ToolCall
	ReasoningContent *string
	ToolCallID       string
	Name             string
	IsError          bool
}

// ToolSpec is a tool as advertised to the model: Parameters is a JSON Schema.
type ToolSpec struct {
	Name        string
	Description string
	Parameters  json.RawMessage
}

// Request is one model call: the system prompt, the whole conversation and
// the tools the agent may call in this step.
type Request struct {
	System   string
	Messages []Message
	Tools    []ToolSpec
	// MaxTokens bounds the answer; 0 leaves it to the adapter's default.
	MaxTokens int64
}

// Finish says how a model answer ended.
type Finish string

const (
	// FinishStop: a complete answer without tool calls; the turn ends.
	FinishStop Finish = "stop"
	// FinishToolCalls: the answer asks for tool calls; the turn goes on.
	FinishToolCalls Finish = "tool_calls"
	// FinishLength: the answer hit the token limit (max-tokens).
	FinishLength Finish = "length"
	// FinishRefusal: the model declined (the turn ends blocked).
	FinishRefusal Finish = "refusal"
)

// Response is a model's complete answer to one Request.
type Response struct {
	Message protocol.AssistantMessage
	Finish  Finish
	Usage   *protocol.Usage
}

// Model is one adapter. Stream sends the request and calls onText with each
// text fragment as it arrives (the runtime keeps them as the partial output
// of a cut step). It returns ctx's error when cancelled and a *Error when the
// model or its transport failed; the turn then ends `error`.
type Model interface {
	// Provider names the adapter ("scripted", "openai"); Name the model id.
	Provider() string
	Name() string
	Stream(ctx context.Context, req Request, onText func(string)) (Response, error)
}

// Error is a model or transport failure with a short diagnostic (no payloads,
// no secrets).
type Error struct {
	Diagnostic string
	Retryable  bool
}

func (e *Error) Error() string { return "model error: " + e.Diagnostic }

// IsError reports whether err is a model failure (rather than a cancellation).
func IsError(err error) bool {
	var e *Error
	return errors.As(err, &e)
}
