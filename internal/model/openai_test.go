package model

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/brood-dev/brood/pkg/protocol"
)

// testKey is the fake API key; a diagnostic must never contain it.
const testKey = "sk-test-secret-0123456789"

// reply is one scripted answer of the fake endpoint.
type reply struct {
	status      int               // 0 means 200 with an SSE body
	header      map[string]string // extra response headers
	body        string            // SSE text (split into events, one flush each) or an error body
	gap         time.Duration     // pause between SSE events
	silentFirst bool              // stay silent before sending headers
	hang        bool              // after the body, stay silent until the client goes away
	reset       bool              // reset the connection (TCP RST) instead of answering
}

// fakeEndpoint is a loopback chat-completions endpoint that replays recorded
// wire formats and records what it received.
type fakeEndpoint struct {
	srv     *httptest.Server
	replies []reply
	done    chan struct{}
	path    string // request path expected; set before the first request

	mu     sync.Mutex
	bodies [][]byte
}

func newFakeEndpoint(t *testing.T, replies ...reply) *fakeEndpoint {
	t.Helper()
	f := &fakeEndpoint{replies: replies, done: make(chan struct{}), path: "/chat/completions"}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve(t)))
	t.Cleanup(f.srv.Close)
	t.Cleanup(func() { close(f.done) }) // runs first: releases hanging handlers
	return f
}

func (f *fakeEndpoint) serve(t *testing.T) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		n := len(f.bodies)
		f.bodies = append(f.bodies, body)
		f.mu.Unlock()
		if r.Method != http.MethodPost || r.URL.Path != f.path {
			t.Errorf("request %s %s, want POST %s", r.Method, r.URL.Path, f.path)
		}
		if got := r.Header.Get("Authorization"); got != "Bearer "+testKey {
			t.Errorf("Authorization = %q", got)
		}
		rp := f.replies[min(n, len(f.replies)-1)]
		if rp.reset {
			resetConn(t, w)
			return
		}
		if rp.silentFirst && !f.wait(r.Context(), 0) {
			return
		}
		for k, v := range rp.header {
			w.Header().Set(k, v)
		}
		if rp.status != 0 && rp.status != http.StatusOK {
			if w.Header().Get("Content-Type") == "" {
				w.Header().Set("Content-Type", "application/json")
			}
			w.WriteHeader(rp.status)
			_, _ = io.WriteString(w, rp.body)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		for i, ev := range strings.SplitAfter(rp.body, "\n\n") {
			if i > 0 && rp.gap > 0 && !f.wait(r.Context(), rp.gap) {
				return
			}
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
		if rp.hang {
			f.wait(r.Context(), 0)
		}
	}
}

// resetConn closes the request's connection with a TCP RST (linger 0), as a
// proxy or an overloaded endpoint may: the client reads "connection reset
// by peer" (or an EOF).
func resetConn(t *testing.T, w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		t.Errorf("hijack: %v", err)
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// wait pauses for d (forever when 0) and reports whether the handler should go on.
func (f *fakeEndpoint) wait(ctx context.Context, d time.Duration) bool {
	var tc <-chan time.Time
	if d > 0 {
		tm := time.NewTimer(d)
		defer tm.Stop()
		tc = tm.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-f.done:
		return false
	case <-tc:
		return true
	}
}

func (f *fakeEndpoint) requests() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]byte(nil), f.bodies...)
}

// newTestOpenAI builds an adapter on the fake endpoint with fast timings.
func newTestOpenAI(t *testing.T, f *fakeEndpoint, mod func(*OpenAIConfig)) *OpenAI {
	t.Helper()
	cfg := OpenAIConfig{
		BaseURL:           f.srv.URL,
		Model:             "deepseek-chat",
		APIKey:            testKey,
		StreamIdleTimeout: 5 * time.Second,
		HTTPClient:        f.srv.Client(),
	}
	if mod != nil {
		mod(&cfg)
	}
	o, err := NewOpenAI(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func fixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "openai", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sse renders chunks as SSE events followed by [DONE].
func sse(chunks ...string) string {
	var b strings.Builder
	for _, c := range chunks {
		b.WriteString("data: " + c + "\n\n")
	}
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// chunk is a minimal chat.completion.chunk with one choice.
func chunk(delta, finish string) string {
	return fmt.Sprintf(`{"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":%s,"logprobs":null,"finish_reason":%s}]}`, delta, finish)
}

func ptr(s string) *string { return &s }

func hello() Request { return Request{Messages: []Message{user("hello")}} }

func TestOpenAIStream(t *testing.T) {
	tests := []struct {
		name       string
		body       string
		wantText   string
		wantDeltas []string
		wantBlocks []protocol.ContentBlock // when the content is not just wantText
		wantCalls  []protocol.ToolCall
		wantReason *string
		wantFin    Finish
		wantUsage  *protocol.Usage
		wantErr    string
	}{
		{name: "openai plain text with usage chunk", body: fixture(t, "openai_text.sse"),
			wantText: "Hello there!", wantDeltas: []string{"Hello", " there", "!"},
			wantFin: FinishStop, wantUsage: &protocol.Usage{InputTokens: 19, OutputTokens: 3}},
		{name: "deepseek plain text after keep-alive comments", body: fixture(t, "deepseek_chat_text.sse"),
			wantText: "你好, world.", wantDeltas: []string{"你好", ", world."},
			wantFin: FinishStop, wantUsage: &protocol.Usage{InputTokens: 11, OutputTokens: 4}},
		{name: "deepseek reasoner: reasoning deltas then content", body: fixture(t, "deepseek_reasoner.sse"),
			wantText: "Hi!", wantDeltas: []string{"Hi", "!"}, wantReason: ptr("Okay, the user says hi.\n"),
			wantFin: FinishStop, wantUsage: &protocol.Usage{InputTokens: 13, OutputTokens: 20}},
		{name: "deepseek empty reasoning_content is present", body: fixture(t, "deepseek_reasoning_empty.sse"),
			wantText: "Done.", wantDeltas: []string{"Done."}, wantReason: ptr(""),
			wantFin: FinishStop, wantUsage: &protocol.Usage{InputTokens: 8, OutputTokens: 2}},
		{name: "openai parallel tool calls in fragments", body: fixture(t, "openai_tool_calls.sse"),
			wantCalls: []protocol.ToolCall{
				{ID: "call_Gk2wBKm6yJ9cbVkyHTpBMFIY", Name: "list_dir", Arguments: `{"path": "src"}`},
				{ID: "call_QnZ8RCx3yXcY4m1yQtFhOqJ2", Name: "read_file", Arguments: `{"path": "caf\u00e9.md",  "n": 1.50}`},
			},
			wantFin: FinishToolCalls, wantUsage: &protocol.Usage{InputTokens: 120, OutputTokens: 41}},
		{name: "deepseek several tool calls in one chunk", body: fixture(t, "deepseek_tool_calls_one_chunk.sse"),
			wantText: "Checking both.", wantDeltas: []string{"Checking both."}, wantReason: ptr("Two lookups."),
			wantCalls: []protocol.ToolCall{
				{ID: "call_00_Q3jB9kXyTz", Name: "list_dir", Arguments: `{"path":"."}`},
				{ID: "call_01_Vb7Lm2NpRs", Name: "read_file", Arguments: `{"path": "go.mod"}`},
			},
			wantFin: FinishToolCalls, wantUsage: &protocol.Usage{InputTokens: 210, OutputTokens: 38}},
		{name: "finish length", body: fixture(t, "openai_length.sse"),
			wantText: "Once upon a", wantDeltas: []string{"Once upon", " a"},
			wantFin: FinishLength, wantUsage: &protocol.Usage{InputTokens: 12, OutputTokens: 3}},
		{name: "finish content_filter", body: fixture(t, "openai_content_filter.sse"),
			wantText: "Here is", wantDeltas: []string{"Here is"}, wantFin: FinishRefusal},
		{name: "refusal field", body: fixture(t, "openai_refusal.sse"),
			wantBlocks: []protocol.ContentBlock{{Type: protocol.BlockText, Text: "I'm sorry, I can't help with that."}},
			wantFin:    FinishRefusal},
		{name: "tool calls with finish stop still call tools", body: sse(
			chunk(`{"role":"assistant","tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"list_dir","arguments":"{}"}}]}`, "null"),
			chunk(`{}`, `"stop"`)),
			wantCalls: []protocol.ToolCall{{ID: "c1", Name: "list_dir", Arguments: "{}"}}, wantFin: FinishToolCalls},
		{name: "tool calls without index", body: sse(
			chunk(`{"tool_calls":[{"id":"a","type":"function","function":{"name":"x","arguments":"{\"k\""}}]}`, "null"),
			chunk(`{"tool_calls":[{"function":{"arguments":":1}"}}]}`, "null"),
			chunk(`{"tool_calls":[{"id":"b","type":"function","function":{"name":"y","arguments":"{}"}}]}`, `"tool_calls"`)),
			wantCalls: []protocol.ToolCall{{ID: "a", Name: "x", Arguments: `{"k":1}`}, {ID: "b", Name: "y", Arguments: "{}"}},
			wantFin:   FinishToolCalls},
		// Issue 14, item 1: a server that gives every call index 0 must not
		// have its calls merged into one ({}{"path":"x"}) and the second lost.
		{name: "two complete calls both at index 0", body: sse(
			chunk(`{"tool_calls":[{"index":0,"id":"A","type":"function","function":{"name":"list_dir","arguments":"{}"}}]}`, "null"),
			chunk(`{"tool_calls":[{"index":0,"id":"B","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"x\"}"}}]}`, `"tool_calls"`)),
			wantCalls: []protocol.ToolCall{{ID: "A", Name: "list_dir", Arguments: "{}"}, {ID: "B", Name: "read_file", Arguments: `{"path":"x"}`}},
			wantFin:   FinishToolCalls},
		{name: "fragments at a reused index follow the latest id", body: sse(
			chunk(`{"tool_calls":[{"index":0,"id":"A","type":"function","function":{"name":"list_dir","arguments":"{\"pa"}}]}`, "null"),
			chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"th\":\".\"}"}}]}`, "null"),
			chunk(`{"tool_calls":[{"index":0,"id":"B","type":"function","function":{"name":"read_file","arguments":"{\"path\""}}]}`, "null"),
			chunk(`{"tool_calls":[{"index":0,"id":"B","function":{"arguments":":\"x\"}"}}]}`, `"tool_calls"`)),
			wantCalls: []protocol.ToolCall{{ID: "A", Name: "list_dir", Arguments: `{"path":"."}`}, {ID: "B", Name: "read_file", Arguments: `{"path":"x"}`}},
			wantFin:   FinishToolCalls},
		{name: "deepseek insufficient_system_resource", body: fixture(t, "deepseek_insufficient_resource.sse"),
			wantErr: `stream ended with finish_reason "insufficient_system_resource"`},
		{name: "error event in stream", body: sse(
			chunk(`{"content":"Hi"}`, "null"),
			`{"error":{"message":"Service overloaded","type":"server_error"}}`),
			wantErr: "error event in stream from %URL%: Service overloaded"},
		{name: "malformed chunk", body: "data: " + chunk(`{"content":"Hi"}`, "null") + "\n\ndata: {\"id\":\"x\",\"choices\":[\n\n",
			wantErr: "malformed stream from %URL%"},
		{name: "stream ends without finish_reason", body: "data: " + chunk(`{"content":"Hi"}`, "null") + "\n\n",
			wantErr: "stream ended without a finish_reason"},
		{name: "tool call index out of range", body: sse(
			chunk(`{"tool_calls":[{"index":100000,"id":"a","type":"function","function":{"name":"x","arguments":"{}"}}]}`, `"tool_calls"`)),
			wantErr: "tool call index 100000 outside"},
		{name: "tool call without name", body: sse(
			chunk(`{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"arguments":"{}"}}]}`, `"tool_calls"`)),
			wantErr: "tool call at index 0 has no id or no name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeEndpoint(t, reply{body: tt.body})
			o := newTestOpenAI(t, f, nil)
			var deltas []string
			resp, err := o.Stream(context.Background(), hello(), func(s string) { deltas = append(deltas, s) })
			if tt.wantErr != "" {
				want := strings.ReplaceAll(tt.wantErr, "%URL%", f.srv.URL)
				var me *Error
				if !errors.As(err, &me) || !strings.Contains(me.Diagnostic, want) {
					t.Fatalf("err = %v, want model error containing %q", err, want)
				}
				if n := len(f.requests()); n != 1 {
					t.Errorf("%d requests, want 1 (no retry once the stream started)", n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			wantBlocks := tt.wantBlocks
			if wantBlocks == nil {
				wantBlocks = protocol.Text(tt.wantText)
			}
			if !reflect.DeepEqual(resp.Message.Content, wantBlocks) {
				t.Errorf("content = %#v, want %#v", resp.Message.Content, wantBlocks)
			}
			if !reflect.DeepEqual(deltas, tt.wantDeltas) {
				t.Errorf("onText got %q, want %q", deltas, tt.wantDeltas)
			}
			if !reflect.DeepEqual(resp.Message.ToolCalls, tt.wantCalls) {
				t.Errorf("tool calls = %#v, want %#v", resp.Message.ToolCalls, tt.wantCalls)
			}
			if !reflect.DeepEqual(resp.Message.ReasoningContent, tt.wantReason) {
				t.Errorf("reasoning = %v, want %v", show(resp.Message.ReasoningContent), show(tt.wantReason))
			}
			if resp.Finish != tt.wantFin {
				t.Errorf("finish = %q, want %q", resp.Finish, tt.wantFin)
			}
			if !reflect.DeepEqual(resp.Usage, tt.wantUsage) {
				t.Errorf("usage = %+v, want %+v", resp.Usage, tt.wantUsage)
			}
		})
	}
}

func show(s *string) string {
	if s == nil {
		return "<absent>"
	}
	return fmt.Sprintf("%q", *s)
}

// wireMessage is a chat message as the endpoint received it; Raw keeps the
// keys so presence can be asserted.
type wireMessage struct {
	Role       string  `json:"role"`
	Content    *string `json:"content"`
	ToolCallID string  `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
	Raw map[string]json.RawMessage `json:"-"`
}

type wireRequest struct {
	Model         string          `json:"model"`
	Stream        bool            `json:"stream"`
	StreamOptions json.RawMessage `json:"stream_options"`
	MaxTokens     int64           `json:"max_tokens"`
	Messages      []wireMessage   `json:"messages"`
	Tools         []struct {
		Type     string                     `json:"type"`
		Function map[string]json.RawMessage `json:"function"`
	} `json:"tools"`
}

func decodeWire(t *testing.T, body []byte) wireRequest {
	t.Helper()
	var w wireRequest
	if err := json.Unmarshal(body, &w); err != nil {
		t.Fatalf("request body is not JSON: %v\n%s", err, body)
	}
	var raw struct {
		Messages []map[string]json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	for i := range w.Messages {
		w.Messages[i].Raw = raw.Messages[i]
	}
	return w
}

func TestOpenAIRequestBody(t *testing.T) {
	schema := `{"type":"object", "required":["path"], "properties":{"path":{"type":"string","description":"relative path"}, "limit":{"type":"number","maximum":1.50}}}`
	argsA := `{"path": "."}`
	argsB := `{"path":"a\u00e9.txt" , "x":1.50}`
	argsC := "{\n  \"path\": \"b.txt\"\n}"
	req := Request{
		System: "You are Brood.\nBe brief.",
		Messages: []Message{
			{Role: RoleUser, Content: []protocol.ContentBlock{
				{Type: protocol.BlockText, Text: "note: you inherit the parent's context", Framing: true},
				{Type: protocol.BlockText, Text: "list the files"},
			}},
			{Role: RoleAssistant, Content: protocol.Text("Let me look."), ReasoningContent: ptr("thinking...\n"),
				ToolCalls: []protocol.ToolCall{{ID: "call_1", Name: "list_dir", Arguments: argsA}, {ID: "call_2", Name: "read_file", Arguments: argsB}}},
			{Role: RoleTool, ToolCallID: "call_1", Name: "list_dir", Content: protocol.Text("a.txt\nb.txt")},
			{Role: RoleTool, ToolCallID: "call_2", Name: "read_file", IsError: true, Content: protocol.Text("error: no such file")},
			{Role: RoleAssistant, Content: []protocol.ContentBlock{}, ReasoningContent: ptr(""),
				ToolCalls: []protocol.ToolCall{{ID: "call_3", Name: "read_file", Arguments: argsC}}},
			{Role: RoleTool, ToolCallID: "call_3", Name: "read_file", Content: protocol.Text("")},
			{Role: RoleAssistant, Content: protocol.Text("Found b.txt (empty).")},
			{Role: RoleUser, Content: protocol.Text("  thanks  ")},
		},
		Tools: []ToolSpec{
			{Name: "read_file", Description: "Read a file in the workspace.", Parameters: json.RawMessage(schema)},
			{Name: "ping"},
		},
		MaxTokens: 256,
	}
	f := newFakeEndpoint(t, reply{body: fixture(t, "openai_text.sse")})
	o := newTestOpenAI(t, f, func(c *OpenAIConfig) { c.MaxTokens = 999 })
	if _, err := o.Stream(context.Background(), req, func(string) {}); err != nil {
		t.Fatal(err)
	}
	body := f.requests()[0]
	w := decodeWire(t, body)

	if w.Model != "deepseek-chat" || !w.Stream || string(w.StreamOptions) != `{"include_usage":true}` || w.MaxTokens != 256 {
		t.Errorf("model %q stream %v stream_options %s max_tokens %d", w.Model, w.Stream, w.StreamOptions, w.MaxTokens)
	}
	type msg struct {
		role, content, toolCallID string
		hasContent                bool
		reasoning                 string // raw JSON, "" when absent
	}
	want := []msg{
		{role: "system", content: "You are Brood.\nBe brief.", hasContent: true},
		{role: "user", content: "note: you inherit the parent's context\nlist the files", hasContent: true},
		{role: "assistant", content: "Let me look.", hasContent: true, reasoning: `"thinking...\n"`},
		{role: "tool", content: "a.txt\nb.txt", hasContent: true, toolCallID: "call_1"},
		{role: "tool", content: "error: no such file", hasContent: true, toolCallID: "call_2"},
		{role: "assistant", reasoning: `""`},
		{role: "tool", content: "", hasContent: true, toolCallID: "call_3"},
		{role: "assistant", content: "Found b.txt (empty).", hasContent: true},
		{role: "user", content: "  thanks  ", hasContent: true},
	}
	if len(w.Messages) != len(want) {
		t.Fatalf("%d messages, want %d:\n%s", len(w.Messages), len(want), body)
	}
	for i, m := range w.Messages {
		got := msg{role: m.Role, toolCallID: m.ToolCallID, hasContent: m.Content != nil, reasoning: string(m.Raw["reasoning_content"])}
		if m.Content != nil {
			got.content = *m.Content
		}
		if got != want[i] {
			t.Errorf("message %d = %+v, want %+v", i, got, want[i])
		}
	}
	type call struct{ id, typ, name, args string }
	var calls []call
	for _, i := range []int{2, 5} {
		for _, c := range w.Messages[i].ToolCalls {
			calls = append(calls, call{c.ID, c.Type, c.Function.Name, c.Function.Arguments})
		}
	}
	wantCalls := []call{{"call_1", "function", "list_dir", argsA}, {"call_2", "function", "read_file", argsB}, {"call_3", "function", "read_file", argsC}}
	if !reflect.DeepEqual(calls, wantCalls) {
		t.Errorf("tool calls = %q, want %q", calls, wantCalls)
	}
	if !bytes.Contains(body, []byte(`"reasoning_content":""`)) {
		t.Errorf("body lacks an empty reasoning_content:\n%s", body)
	}

	if len(w.Tools) != 2 {
		t.Fatalf("%d tools, want 2", len(w.Tools))
	}
	var compact bytes.Buffer
	_ = json.Compact(&compact, []byte(schema))
	rf := w.Tools[0].Function
	if w.Tools[0].Type != "function" || string(rf["name"]) != `"read_file"` || string(rf["description"]) != `"Read a file in the workspace."` {
		t.Errorf("tool 0 = %s %v", w.Tools[0].Type, rf)
	}
	if string(rf["parameters"]) != compact.String() {
		t.Errorf("parameters = %s, want the schema as written %s", rf["parameters"], compact.String())
	}
	if pf := w.Tools[1].Function; string(pf["name"]) != `"ping"` || pf["parameters"] != nil || pf["description"] != nil {
		t.Errorf("tool 1 = %v, want name only", pf)
	}
}

// TestOpenAIReasoningEcho: the reasoning_content of an answer goes back
// exactly as received on the next request (docs/design.md §5).
func TestOpenAIReasoningEcho(t *testing.T) {
	tests := []struct {
		name    string
		fixture string
		wantRaw string // reasoning_content of the echoed message as JSON; "" when absent
	}{
		{"empty string stays present", "deepseek_reasoning_empty.sse", `""`},
		{"reasoner text", "deepseek_reasoner.sse", `"Okay, the user says hi.\n"`},
		{"absent stays absent", "openai_text.sse", ``},
		{"with tool calls", "deepseek_tool_calls_one_chunk.sse", `"Two lookups."`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeEndpoint(t, reply{body: fixture(t, tt.fixture)}, reply{body: fixture(t, "deepseek_chat_text.sse")})
			o := newTestOpenAI(t, f, nil)
			first := hello()
			resp, err := o.Stream(context.Background(), first, func(string) {})
			if err != nil {
				t.Fatal(err)
			}
			next := first
			next.Messages = append(next.Messages, Message{Role: RoleAssistant, Content: resp.Message.Content,
				ToolCalls: resp.Message.ToolCalls, ReasoningContent: resp.Message.ReasoningContent})
			for _, c := range resp.Message.ToolCalls {
				next.Messages = append(next.Messages, Message{Role: RoleTool, ToolCallID: c.ID, Name: c.Name, Content: protocol.Text("ok")})
			}
			next.Messages = append(next.Messages, user("go on"))
			if _, err := o.Stream(context.Background(), next, func(string) {}); err != nil {
				t.Fatal(err)
			}
			w := decodeWire(t, f.requests()[1])
			got := w.Messages[1]
			if got.Role != "assistant" {
				t.Fatalf("message 1 role %q", got.Role)
			}
			if raw := string(got.Raw["reasoning_content"]); raw != tt.wantRaw {
				t.Errorf("echoed reasoning_content = %s, want %s", orAbsent(raw), orAbsent(tt.wantRaw))
			}
			for i, c := range got.ToolCalls {
				if c.ID != resp.Message.ToolCalls[i].ID || c.Function.Arguments != resp.Message.ToolCalls[i].Arguments {
					t.Errorf("echoed call %d = %+v", i, c)
				}
			}
		})
	}
}

func orAbsent(s string) string {
	if s == "" {
		return "<absent>"
	}
	return s
}

// TestOpenAIFailures: each Stream call is one attempt (retries are the
// runtime's); a failure is a *Error with its HTTP status and Retry-After,
// Retryable only when it is temporary and nothing of the answer arrived.
func TestOpenAIFailures(t *testing.T) {
	rateLimited := reply{status: 429, body: `{"error":{"message":"Rate limit reached for requests","type":"requests","param":null,"code":"rate_limit_exceeded"}}`}
	serverError := reply{status: 500, body: `{"error":{"message":"The server had an error while processing your request.","type":"server_error"}}`}
	cut := sse(chunk(`{"role":"assistant","content":"Hel"}`, "null"))
	cut = cut[:strings.Index(cut, "data: [DONE]")]
	tests := []struct {
		name           string
		reply          reply
		wantErr        string // %URL% is the endpoint; a prefix when wantPrefix
		wantPrefix     bool
		wantRetry      bool // Error.Retryable
		wantStatus     int
		wantRetryAfter time.Duration
		wantStreamed   string
	}{
		{name: "429 is temporary", reply: rateLimited,
			wantErr: "HTTP 429 from %URL%: Rate limit reached for requests", wantRetry: true, wantStatus: 429},
		{name: "429 with Retry-After", reply: reply{status: 429, header: map[string]string{"Retry-After": "7"}, body: rateLimited.body},
			wantErr: "HTTP 429 from %URL%: Rate limit reached for requests", wantRetry: true, wantStatus: 429, wantRetryAfter: 7 * time.Second},
		{name: "Retry-After as a date is ignored", reply: reply{status: 429, header: map[string]string{"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, body: rateLimited.body},
			wantErr: "HTTP 429 from %URL%: Rate limit reached for requests", wantRetry: true, wantStatus: 429},
		{name: "500 is temporary", reply: serverError,
			wantErr: "HTTP 500 from %URL%: The server had an error while processing your request.", wantRetry: true, wantStatus: 500},
		{name: "503 plain body", reply: reply{status: 503, header: map[string]string{"Content-Type": "text/plain"}, body: "upstream connect error"},
			wantErr: "HTTP 503 from %URL%: upstream connect error", wantRetry: true, wantStatus: 503},
		{name: "408 is temporary", reply: reply{status: 408},
			wantErr: "HTTP 408 from %URL%: request timeout", wantRetry: true, wantStatus: 408},
		{name: "connection reset before the answer", reply: reply{reset: true},
			wantErr: "request to %URL% failed: ", wantPrefix: true, wantRetry: true},
		{name: "stream ended without a finish, nothing streamed", reply: reply{body: "data: [DONE]\n\n"},
			wantErr: "stream ended without a finish_reason", wantRetry: true},
		{name: "stream cut after content is not retried", reply: reply{body: cut},
			wantErr: "stream ended without a finish_reason", wantStreamed: "Hel"},
		{name: "401 is permanent and hides the key", reply: reply{status: 401,
			body: `{"error":{"message":"Authentication Fails, Your api key: ` + testKey + ` is invalid","type":"authentication_error","param":null,"code":"invalid_request_error"}}`},
			wantErr: "HTTP 401 from %URL%: Authentication Fails, Your api key: [redacted] is invalid", wantStatus: 401},
		{name: "deepseek masked key is hidden too", reply: reply{status: 401,
			body: `{"error":{"message":"Authentication Fails, Your api key: ****6789 is invalid","type":"authentication_error","param":null,"code":"invalid_request_error"}}`},
			wantErr: "HTTP 401 from %URL%: Authentication Fails, Your api key: **** is invalid", wantStatus: 401},
		{name: "400 context length", reply: reply{status: 400,
			body: `{"error":{"message":"This model's maximum context length is 65536 tokens.","type":"invalid_request_error","param":null,"code":"invalid_request_error"}}`},
			wantErr: "HTTP 400 from %URL%: This model's maximum context length is 65536 tokens.", wantStatus: 400},
		{name: "404 plain text body", reply: reply{status: 404, header: map[string]string{"Content-Type": "text/plain"}, body: "404 page not found\n"},
			wantErr: "HTTP 404 from %URL%: 404 page not found", wantStatus: 404},
		{name: "402 empty body", reply: reply{status: 402},
			wantErr: "HTTP 402 from %URL%: payment required", wantStatus: 402},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeEndpoint(t, tt.reply)
			o := newTestOpenAI(t, f, nil)
			var streamed string
			_, err := o.Stream(context.Background(), hello(), func(s string) { streamed += s })
			if n := len(f.requests()); n != 1 {
				t.Errorf("%d requests, want 1 (the adapter never retries)", n)
			}
			var me *Error
			if !errors.As(err, &me) {
				t.Fatalf("err = %v, want *Error", err)
			}
			want := strings.ReplaceAll(tt.wantErr, "%URL%", f.srv.URL)
			if got := me.Diagnostic; got != want && !(tt.wantPrefix && strings.HasPrefix(got, want)) {
				t.Errorf("diagnostic = %q\nwant         %q", got, want)
			}
			if me.Retryable != tt.wantRetry || me.Status != tt.wantStatus || me.RetryAfter != tt.wantRetryAfter {
				t.Errorf("retryable %v status %d retryAfter %v, want %v %d %v", me.Retryable, me.Status, me.RetryAfter, tt.wantRetry, tt.wantStatus, tt.wantRetryAfter)
			}
			if streamed != tt.wantStreamed {
				t.Errorf("streamed %q, want %q", streamed, tt.wantStreamed)
			}
			if strings.Contains(me.Error(), testKey) {
				t.Errorf("diagnostic leaks the key: %q", me.Error())
			}
		})
	}
	t.Run("connection refused is temporary", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		_ = l.Close() // nothing listens there now
		o, err := NewOpenAI(OpenAIConfig{BaseURL: "http://" + addr, Model: "m", APIKey: testKey})
		if err != nil {
			t.Fatal(err)
		}
		_, err = o.Stream(context.Background(), hello(), func(string) {})
		var me *Error
		if !errors.As(err, &me) || !me.Retryable || me.Status != 0 {
			t.Fatalf("err = %#v, want a retryable *Error without status", err)
		}
	})
}

func TestOpenAIDiagnosticIsShort(t *testing.T) {
	long := strings.Repeat("é", 2000)
	f := newFakeEndpoint(t, reply{status: 400, body: `{"error":{"message":"` + long + `"}}`})
	o := newTestOpenAI(t, f, nil)
	_, err := o.Stream(context.Background(), hello(), func(string) {})
	var me *Error
	if !errors.As(err, &me) {
		t.Fatalf("err = %v", err)
	}
	if len(me.Diagnostic) > diagnosticBytesMax || !strings.HasSuffix(me.Diagnostic, "...") || !strings.HasPrefix(me.Diagnostic, "HTTP 400 from ") {
		t.Errorf("diagnostic (%d bytes) = %q", len(me.Diagnostic), me.Diagnostic)
	}
	if !json.Valid([]byte(`"` + me.Diagnostic + `"`)) {
		t.Errorf("diagnostic cut inside a rune")
	}
}

// checkNoLeaks fails the test if it leaves goroutines behind. Register it
// before the endpoint so it runs after the endpoint's cleanup.
func checkNoLeaks(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

func TestOpenAIStreamIdleTimeout(t *testing.T) {
	const idle = 100 * time.Millisecond
	first := sse(chunk(`{"role":"assistant","content":"Hel"}`, "null"))
	first = first[:strings.Index(first, "data: [DONE]")]
	// Keep-alives: 8 gaps of 150 ms, 1.2 s without content in all, each gap
	// far inside a 1 s idle timeout (gaps of a third of 100 ms passed it on
	// a loaded machine).
	const keepAliveIdle, keepAliveGap = time.Second, 150 * time.Millisecond
	tests := []struct {
		name     string
		idle     time.Duration // 0: idle
		reply    reply
		wantText string
		wantErr  string
		// wantRetry: Error.Retryable, true only when nothing of the
		// answer arrived before the silence
		wantRetry bool
	}{
		{name: "silent after the first chunk", reply: reply{body: first, hang: true},
			wantText: "Hel", wantErr: "no data from %URL% for 100ms"},
		{name: "silent before the headers", reply: reply{silentFirst: true},
			wantErr: "no data from %URL% for 100ms", wantRetry: true},
		{name: "keep-alive comments are not silence", idle: keepAliveIdle, reply: reply{gap: keepAliveGap,
			body: strings.Repeat(": keep-alive\n\n", 8) + fixture(t, "openai_text.sse")},
			wantText: "Hello there!"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkNoLeaks(t)
			f := newFakeEndpoint(t, tt.reply)
			timeout := idle
			if tt.idle > 0 {
				timeout = tt.idle
			}
			o := newTestOpenAI(t, f, func(c *OpenAIConfig) { c.StreamIdleTimeout = timeout })
			var streamed string
			start := time.Now()
			_, err := o.Stream(context.Background(), hello(), func(s string) { streamed += s })
			if el := time.Since(start); el > 5*time.Second+8*keepAliveGap {
				t.Errorf("took %v with a %v idle timeout", el, timeout)
			}
			if streamed != tt.wantText {
				t.Errorf("streamed %q, want %q", streamed, tt.wantText)
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var me *Error
			if want := strings.ReplaceAll(tt.wantErr, "%URL%", f.srv.URL); !errors.As(err, &me) || me.Diagnostic != want {
				t.Fatalf("err = %v, want model error %q", err, want)
			}
			if n := len(f.requests()); n != 1 {
				t.Errorf("%d requests, want 1 (the adapter never retries)", n)
			}
			if me.Retryable != tt.wantRetry {
				t.Errorf("retryable %v, want %v", me.Retryable, tt.wantRetry)
			}
		})
	}
}

func TestOpenAICancel(t *testing.T) {
	t.Run("mid-stream returns ctx error after partial text", func(t *testing.T) {
		checkNoLeaks(t)
		body := sse(chunk(`{"role":"assistant","content":"Hel"}`, "null"))
		f := newFakeEndpoint(t, reply{body: body[:strings.Index(body, "data: [DONE]")], hang: true})
		o := newTestOpenAI(t, f, nil)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var streamed string
		_, err := o.Stream(ctx, hello(), func(s string) { streamed += s; cancel() })
		if !errors.Is(err, context.Canceled) || IsError(err) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if streamed != "Hel" {
			t.Errorf("streamed %q, want %q", streamed, "Hel")
		}
	})
}

// TestOpenAIBasePath: an OpenAI-style base URL keeps its path
// ("https://api.openai.com/v1" posts to /v1/chat/completions).
func TestOpenAIBasePath(t *testing.T) {
	f := newFakeEndpoint(t, reply{body: fixture(t, "openai_text.sse")})
	f.path = "/v1/chat/completions"
	o := newTestOpenAI(t, f, func(c *OpenAIConfig) { c.BaseURL = f.srv.URL + "/v1"; c.Model = "gpt-4o-mini" })
	if _, err := o.Stream(context.Background(), hello(), func(string) {}); err != nil {
		t.Fatal(err)
	}
	if w := decodeWire(t, f.requests()[0]); w.Model != "gpt-4o-mini" {
		t.Errorf("model %q", w.Model)
	}
}

func TestNewOpenAIValidates(t *testing.T) {
	ok := OpenAIConfig{BaseURL: "https://api.deepseek.com", Model: "deepseek-chat", APIKey: testKey}
	tests := []struct {
		name    string
		mod     func(*OpenAIConfig)
		wantErr string
	}{
		{"valid", func(*OpenAIConfig) {}, ""},
		{"openai base with path", func(c *OpenAIConfig) { c.BaseURL = "https://api.openai.com/v1" }, ""},
		{"no key", func(c *OpenAIConfig) { c.APIKey = "" }, "no API key"},
		{"no model", func(c *OpenAIConfig) { c.Model = "" }, "no model name"},
		{"no base URL", func(c *OpenAIConfig) { c.BaseURL = "" }, "not an http(s) URL"},
		{"not http", func(c *OpenAIConfig) { c.BaseURL = "ftp://api.deepseek.com" }, "not an http(s) URL"},
		{"no host", func(c *OpenAIConfig) { c.BaseURL = "https://" }, "not an http(s) URL"},
		{"unparsable", func(c *OpenAIConfig) { c.BaseURL = "://x" }, "not an http(s) URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ok
			tt.mod(&cfg)
			o, err := NewOpenAI(cfg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), testKey) {
					t.Errorf("error leaks the key")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.Provider() != "openai" || o.Name() != cfg.Model {
				t.Errorf("provider %q name %q", o.Provider(), o.Name())
			}
			if o.cfg.StreamIdleTimeout != 60*time.Second || o.cfg.RequestTimeout <= 0 || o.cfg.HTTPClient == nil {
				t.Errorf("defaults not applied: %+v", o.cfg)
			}
		})
	}
	var _ Model = (*OpenAI)(nil)
}

func TestOpenAIConfigFromEnv(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want OpenAIConfig
	}{
		{"defaults, no key", nil,
			OpenAIConfig{BaseURL: DefaultOpenAIBaseURL, Model: DefaultOpenAIModel}},
		{"deepseek key wins", map[string]string{EnvDeepSeekKey: "ds", EnvOpenAIKey: "oa"},
			OpenAIConfig{BaseURL: DefaultOpenAIBaseURL, Model: DefaultOpenAIModel, APIKey: "ds"}},
		{"openai key as fallback", map[string]string{EnvOpenAIKey: "oa"},
			OpenAIConfig{BaseURL: DefaultOpenAIBaseURL, Model: DefaultOpenAIModel, APIKey: "oa"}},
		{"endpoint from env", map[string]string{EnvModelBaseURL: "https://api.openai.com/v1", EnvModelName: "gpt-4o-mini", EnvOpenAIKey: "oa"},
			OpenAIConfig{BaseURL: "https://api.openai.com/v1", Model: "gpt-4o-mini", APIKey: "oa"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{EnvModelBaseURL, EnvModelName, EnvDeepSeekKey, EnvOpenAIKey} {
				t.Setenv(k, tt.env[k])
			}
			if got := OpenAIConfigFromEnv(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	t.Run("no key means no adapter", func(t *testing.T) {
		for _, k := range []string{EnvDeepSeekKey, EnvOpenAIKey} {
			t.Setenv(k, "")
		}
		if _, err := NewOpenAI(OpenAIConfigFromEnv()); err == nil {
			t.Fatal("NewOpenAI accepted a config without a key")
		}
	})
}
