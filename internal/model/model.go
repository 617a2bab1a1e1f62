// Package model holds Brood's model adapters behind one interface: `scripted`
// (deterministic, no network; the default) and `openai` (any
// OpenAI-compatible chat-completions endpoint, DeepSeek by default). docs/design.md §5.
package model

import (
	"context"
	"encoding/json"
	"errors"
	"time"

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
// model or its transport failed. Each call is one attempt: an adapter does
// not retry. The runtime retries a *Error marked Retryable (the turn pauses
// with a model/retry event, internal/agent) and ends the turn `error`
// MODEL_ERROR on any other.
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
	// Retryable says the failure is temporary and nothing of the answer
	// arrived (onText was never called, no tool call or reasoning was
	// read), so the same request may be sent again and repeats nothing:
	// an HTTP 429 or 5xx, a transport failure (a connection reset or
	// refused, an EOF before the answer), an attempt that timed out, a
	// stream that ended without a finish. The runtime then pauses the turn
	// and retries (docs/protocol.md §8.3, model/retry). False: the same
	// request would fail the same way (HTTP 400, 401, 403, 404, a malformed
	// stream) or part of the answer was already streamed.
	Retryable bool
	// Status is the HTTP status of the failed answer, 0 when there was
	// none (a transport failure, a timeout, a failure inside the stream).
	Status int
	// RetryAfter is the endpoint's Retry-After (the seconds form), 0 when
	// absent or not a positive number of seconds. The runtime waits at
	// least this long, up to its own cap, before the next attempt.
	RetryAfter time.Duration
}

func (e *Error) Error() string { return "model error: " + e.Diagnostic }

// IsError reports whether err is a model failure (rather than a cancellation).
func IsError(err error) bool {
	var e *Error
	return errors.As(err, &e)
}

// TokenEstimator is a model that estimates a request's input tokens before
// it is sent, at least what it will report: a budgeted agent reserves that
// many tokens, plus its answer's bound, before each request
// (docs/protocol.md §5.5, "Budgets").
type TokenEstimator interface {
	EstimateInputTokens(req Request) int64
}

// EstimateInputTokens is m's estimate of req's input tokens: its own
// (TokenEstimator), else one token per two bytes of the system prompt, the
// messages' text, tool calls and the tools' schemas (a byte-pair
// tokenizer's tokens are rarely shorter than two bytes).
func EstimateInputTokens(m Model, req Request) int64 {
	if e, ok := m.(TokenEstimator); ok {
		return e.EstimateInputTokens(req)
	}
	n := len(req.System)
	for _, msg := range req.Messages {
		n += len(protocol.AllText(msg.Content)) + len(msg.Name) + 8 // role and framing
		for _, c := range msg.ToolCalls {
			n += len(c.Name) + len(c.Arguments) + len(c.ID)
		}
	}
	for _, t := range req.Tools {
		n += len(t.Name) + len(t.Description) + len(t.Parameters)
	}
	return int64(n+1) / 2
}
