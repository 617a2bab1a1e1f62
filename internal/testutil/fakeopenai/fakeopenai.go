// Package fakeopenai is a strict fake of an OpenAI-compatible chat-completions
// endpoint for tests (DeepSeek's thinking mode included). It listens on
// loopback only, answers each request with the next scripted reply as an SSE
// stream, and checks every request the way the strictest real servers do,
// answering HTTP 400 (and recording why) when a request breaks a rule:
//
//   - the body is JSON with a model, stream: true and at least one message;
//     roles are system, user, assistant or tool;
//   - an assistant message has content or tool calls; each tool call has a
//     non-empty id, type "function", a name, and arguments that are a JSON
//     object (vLLM and Anthropic-compatible gateways parse them);
//   - tool-call ids are unique in the whole conversation (unless
//     Config.DuplicateIDs);
//   - the tool calls of an assistant message are answered, each exactly once,
//     by the tool messages that directly follow it (a call without a result,
//     a result without its call, or a result after another message is
//     refused), as OpenAI refuses them;
//   - in DeepSeek thinking mode (Config.Thinking), every assistant message
//     that carries tool calls carries reasoning_content ("" counts), as
//     DeepSeek answers "Missing `reasoning_content` field in the assistant
//     message at message index N" otherwise;
//   - each tool is a function with a name and, when given, parameters that
//     are a JSON object.
//
// Tests assert Rejections() is empty (Brood never sent a request a strict
// server refuses) and read Requests() to check what was sent.
package fakeopenai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
)

// Key is the bearer token the server expects unless Config.Key says otherwise.
const Key = "sk-fake-0123456789"

// Config configures a Server. Zero values take the defaults given per field.
type Config struct {
	// Key is the expected bearer token (default Key).
	Key string
	// Thinking turns on DeepSeek's thinking-mode rule: assistant messages
	// with tool calls must carry reasoning_content.
	Thinking bool
	// DuplicateIDs accepts a tool-call id used twice, as lenient servers
	// do (the servers that number calls call_0 in every step).
	DuplicateIDs bool
}

// Call is one tool call of a scripted reply.
type Call struct {
	ID, Name, Arguments string
}

// Reply is one scripted answer, streamed as chat.completion.chunk events.
// Text is sent in one delta, Reasoning (when set) before it; each call is
// its own delta with its full arguments, at its position as index (or at
// index 0 for every call when SameIndex is set, as some servers do). Finish
// defaults to "tool_calls" when there are calls, else "stop". Status, when
// not 0 or 200, answers that HTTP status with Body instead of a stream;
// Header adds response headers (a Retry-After). Reset answers nothing: the
// connection is closed with a TCP RST, as a proxy that drops it does.
// Repeat keeps the reply at the head of the queue: it answers every later
// request (a rate limit that never clears).
type Reply struct {
	Text      string
	Reasoning *string
	Calls     []Call
	SameIndex bool
	Finish    string
	Status    int
	Body      string
	Header    map[string]string
	Reset     bool
	Repeat    bool
}

// Status is a reply that answers HTTP status with body instead of a stream.
func Status(status int, body string) Reply { return Reply{Status: status, Body: body} }

// Say is a reply with text only.
func Say(text string) Reply { return Reply{Text: text} }

// Calls is a reply that calls tools.
func Calls(calls ...Call) Reply { return Reply{Calls: calls} }

// Message is a chat message as the server received it.
type Message struct {
	Role       string
	Content    *string // nil when absent or null
	ToolCallID string
	ToolCalls  []Call
	// Reasoning is the raw JSON of reasoning_content, "" when absent.
	Reasoning string
}

// Request is one request as the server received it.
type Request struct {
	Model    string
	Messages []Message
	Tools    []string // tool names
	Body     []byte
}

// Server is a running fake endpoint. URL is its base URL (use it as the
// adapter's BaseURL); the path is /chat/completions below it.
type Server struct {
	URL string
	cfg Config
	srv *httptest.Server

	mu         sync.Mutex
	replies    []Reply
	requests   []Request
	rejections []string
}

// New starts a server on loopback; it stops at the end of the test.
func New(t testing.TB, cfg Config, replies ...Reply) *Server {
	t.Helper()
	if cfg.Key == "" {
		cfg.Key = Key
	}
	s := &Server{cfg: cfg, replies: append([]Reply(nil), replies...)}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	t.Cleanup(s.srv.Close)
	return s
}

// Push queues more replies.
func (s *Server) Push(replies ...Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.replies = append(s.replies, replies...)
}

// Requests returns the requests received so far, refused ones included.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Rejections returns why each refused request was refused, in order.
func (s *Server) Rejections() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.rejections...)
}

// HTTPClient is a client for the server.
func (s *Server) HTTPClient() *http.Client { return s.srv.Client() }

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	req, verr := s.check(r, body)
	s.mu.Lock()
	s.requests = append(s.requests, req)
	var rp Reply
	switch {
	case verr != "":
		s.rejections = append(s.rejections, verr)
	case len(s.replies) == 0:
		verr = "fakeopenai: no scripted reply left"
		s.rejections = append(s.rejections, verr)
	default:
		rp = s.replies[0]
		if !rp.Repeat {
			s.replies = s.replies[1:]
		}
	}
	s.mu.Unlock()
	if verr != "" {
		writeError(w, http.StatusBadRequest, verr)
		return
	}
	if rp.Reset {
		reset(w)
		return
	}
	for k, v := range rp.Header {
		w.Header().Set(k, v)
	}
	if rp.Status != 0 && rp.Status != http.StatusOK {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rp.Status)
		_, _ = io.WriteString(w, rp.Body)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	for _, ev := range rp.events() {
		_, _ = io.WriteString(w, "data: "+ev+"\n\n")
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

// reset closes the request's connection with a TCP RST (linger 0): the
// client reads "connection reset by peer" or an EOF, never an answer.
func reset(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": msg, "type": "invalid_request_error", "param": nil, "code": "invalid_request_error"}})
	_, _ = w.Write(b)
}

func chunk(delta map[string]any, finish string) string {
	var fin any
	if finish != "" {
		fin = finish
	}
	b, _ := json.Marshal(map[string]any{
		"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake",
		"choices": []any{map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": fin}},
	})
	return string(b)
}

// events renders the reply as chunk JSON texts, usage last.
func (rp Reply) events() []string {
	var out []string
	out = append(out, chunk(map[string]any{"role": "assistant", "content": ""}, ""))
	if rp.Reasoning != nil {
		out = append(out, chunk(map[string]any{"reasoning_content": *rp.Reasoning}, ""))
	}
	if rp.Text != "" {
		out = append(out, chunk(map[string]any{"content": rp.Text}, ""))
	}
	for i, c := range rp.Calls {
		idx := i
		if rp.SameIndex {
			idx = 0
		}
		out = append(out, chunk(map[string]any{"tool_calls": []any{map[string]any{
			"index": idx, "id": c.ID, "type": "function",
			"function": map[string]any{"name": c.Name, "arguments": c.Arguments},
		}}}, ""))
	}
	fin := rp.Finish
	if fin == "" {
		fin = "stop"
		if len(rp.Calls) > 0 {
			fin = "tool_calls"
		}
	}
	out = append(out, chunk(map[string]any{}, fin))
	usage, _ := json.Marshal(map[string]any{"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake",
		"choices": []any{}, "usage": map[string]any{"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})
	return append(out, string(usage))
}

type wireCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      *string `json:"name"`
		Arguments *string `json:"arguments"`
	} `json:"function"`
}

type wireMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCallID string          `json:"tool_call_id"`
	ToolCalls  []wireCall      `json:"tool_calls"`
	Reasoning  json.RawMessage `json:"reasoning_content"`
}

type wireRequest struct {
	Model    string        `json:"model"`
	Stream   bool          `json:"stream"`
	Messages []wireMessage `json:"messages"`
	Tools    []struct {
		Type     string `json:"type"`
		Function struct {
			Name       string          `json:"name"`
			Parameters json.RawMessage `json:"parameters"`
		} `json:"function"`
	} `json:"tools"`
}

// check decodes and validates one request; the second result is why it is
// refused ("" when it is accepted).
func (s *Server) check(r *http.Request, body []byte) (Request, string) {
	req := Request{Body: body}
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/chat/completions") {
		return req, fmt.Sprintf("%s %s: only POST .../chat/completions is served", r.Method, r.URL.Path)
	}
	if r.Header.Get("Authorization") != "Bearer "+s.cfg.Key {
		return req, "Authentication Fails: invalid api key"
	}
	var w wireRequest
	if err := json.Unmarshal(body, &w); err != nil {
		return req, "the request body is not valid JSON: " + err.Error()
	}
	req.Model = w.Model
	for _, t := range w.Tools {
		req.Tools = append(req.Tools, t.Function.Name)
	}
	for _, m := range w.Messages {
		req.Messages = append(req.Messages, convert(m))
	}
	if w.Model == "" {
		return req, "you must provide a model parameter"
	}
	if !w.Stream {
		return req, "this fake serves streamed requests only (stream: true)"
	}
	if len(w.Messages) == 0 {
		return req, "messages must not be empty"
	}
	for i, t := range w.Tools {
		if t.Type != "function" || t.Function.Name == "" {
			return req, fmt.Sprintf("tools[%d]: a tool must be a function with a name", i)
		}
		if len(t.Function.Parameters) > 0 && !isObject(t.Function.Parameters) {
			return req, fmt.Sprintf("tools[%d].function.parameters must be a JSON object", i)
		}
	}
	return req, s.checkMessages(w.Messages)
}

func convert(m wireMessage) Message {
	out := Message{Role: m.Role, ToolCallID: m.ToolCallID, Reasoning: string(m.Reasoning)}
	var text string
	if len(m.Content) > 0 && json.Unmarshal(m.Content, &text) == nil {
		out.Content = &text
	}
	for _, c := range m.ToolCalls {
		var name, args string
		if c.Function.Name != nil {
			name = *c.Function.Name
		}
		if c.Function.Arguments != nil {
			args = *c.Function.Arguments
		}
		out.ToolCalls = append(out.ToolCalls, Call{ID: c.ID, Name: name, Arguments: args})
	}
	return out
}

func isObject(raw []byte) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{' && json.Valid(raw)
}

// checkMessages enforces the conversation rules of the package comment.
func (s *Server) checkMessages(msgs []wireMessage) string {
	ids := map[string]int{}      // every tool-call id → the message that made it
	pending := map[string]bool{} // calls of the last assistant message not yet answered
	var pendingFrom int
	open := false // tool messages may follow now
	for i, m := range msgs {
		if m.Role != "tool" && len(pending) > 0 {
			return fmt.Sprintf("messages[%d]: an assistant message with 'tool_calls' (messages[%d]) must be followed by tool messages responding to each 'tool_call_id'; missing: %s",
				i, pendingFrom, strings.Join(keys(pending), ", "))
		}
		switch m.Role {
		case "system", "user":
			if string(m.Content) == "null" || len(m.Content) == 0 {
				return fmt.Sprintf("messages[%d]: a %s message needs content", i, m.Role)
			}
			open = false
		case "assistant":
			hasContent := len(m.Content) > 0 && string(m.Content) != "null"
			if !hasContent && len(m.ToolCalls) == 0 {
				return fmt.Sprintf("messages[%d]: an assistant message needs content or tool_calls", i)
			}
			if s.cfg.Thinking && len(m.ToolCalls) > 0 && len(m.Reasoning) == 0 {
				return fmt.Sprintf("Missing `reasoning_content` field in the assistant message at message index %d", i)
			}
			for j, c := range m.ToolCalls {
				switch {
				case c.ID == "":
					return fmt.Sprintf("messages[%d].tool_calls[%d]: id is required", i, j)
				case c.Type != "function":
					return fmt.Sprintf("messages[%d].tool_calls[%d]: type must be function", i, j)
				case c.Function.Name == nil || *c.Function.Name == "":
					return fmt.Sprintf("messages[%d].tool_calls[%d]: function.name is required", i, j)
				case c.Function.Arguments == nil || !isObject([]byte(*c.Function.Arguments)):
					return fmt.Sprintf("messages[%d].tool_calls[%d]: function.arguments must be a JSON object encoded as a string", i, j)
				}
				if k, dup := ids[c.ID]; dup && !s.cfg.DuplicateIDs {
					return fmt.Sprintf("messages[%d].tool_calls[%d]: duplicate tool_call id %q (first used in messages[%d])", i, j, c.ID, k)
				}
				ids[c.ID] = i
				pending[c.ID] = true
			}
			pendingFrom, open = i, len(m.ToolCalls) > 0
		case "tool":
			if !open || !pending[m.ToolCallID] {
				return fmt.Sprintf("messages[%d]: messages with role 'tool' must be a response to a preceding message with 'tool_calls' (tool_call_id %q has no pending call)", i, m.ToolCallID)
			}
			delete(pending, m.ToolCallID)
		default:
			return fmt.Sprintf("messages[%d]: unknown role %q", i, m.Role)
		}
	}
	if len(pending) > 0 {
		return fmt.Sprintf("the assistant message with 'tool_calls' (messages[%d]) is not followed by tool messages for: %s", pendingFrom, strings.Join(keys(pending), ", "))
	}
	return ""
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
