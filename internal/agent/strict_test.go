package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/testutil/fakeopenai"
	"github.com/brood-dev/brood/pkg/protocol"
)

func strictModel(t *testing.T, srv *fakeopenai.Server) model.Model {
	t.Helper()
	m, err := model.NewOpenAI(model.OpenAIConfig{
		BaseURL: srv.URL, Model: "deepseek-chat", APIKey: fakeopenai.Key, HTTPClient: srv.HTTPClient(),
		StreamIdleTimeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func ptrS(s string) *string { return &s }

// TestStrictServerAcceptsEveryRequest drives the runtime with the openai
// adapter against a strict OpenAI-compatible server through faults models
// produce (issue 14, items 1–3): every request Brood sends, within the turn
// and in the next turn (a replay of the whole log), is one the server
// accepts, and the log still replays (ValidateReplay, the fork check).
func TestStrictServerAcceptsEveryRequest(t *testing.T) {
	call := func(id, args string) fakeopenai.Call {
		return fakeopenai.Call{ID: id, Name: "list_dir", Arguments: args}
	}
	tests := []struct {
		name     string
		thinking bool
		turn1    []fakeopenai.Reply
		want1    string // turn/end kind of turn 1
		check    func(t *testing.T, evs []protocol.SessionEvent, reqs []fakeopenai.Request)
	}{
		{name: "a server that numbers calls call_0 in every step",
			turn1: []fakeopenai.Reply{fakeopenai.Calls(call("call_0", "{}")), fakeopenai.Calls(call("call_0", "{}")), fakeopenai.Say("done")},
			want1: protocol.TurnCompleted,
			check: func(t *testing.T, evs []protocol.SessionEvent, _ []fakeopenai.Request) {
				calls := toolCalls(t, evs)
				if len(calls) != 2 || calls[0].CallID != "call_0" || calls[1].CallID != "call_0_2" || calls[1].ModelCallID != "call_0" || calls[0].ModelCallID != "" {
					t.Fatalf("tool/call events %+v", calls)
				}
			}},
		{name: "two parallel calls with one id",
			turn1: []fakeopenai.Reply{fakeopenai.Calls(call("c", "{}"), call("c", `{"path":"."}`)), fakeopenai.Say("done")},
			want1: protocol.TurnCompleted,
			check: func(t *testing.T, evs []protocol.SessionEvent, _ []fakeopenai.Request) {
				if r := toolResults(t, evs); len(r) != 2 || r[0].CallID != "c" || r[1].CallID != "c_2" || r[0].IsError || r[1].IsError {
					t.Fatalf("tool results %+v", r)
				}
			}},
		{name: "two calls at index 0 with distinct ids",
			turn1: []fakeopenai.Reply{{Calls: []fakeopenai.Call{call("A", "{}"), call("B", `{"path":"."}`)}, SameIndex: true}, fakeopenai.Say("done")},
			want1: protocol.TurnCompleted,
			check: func(t *testing.T, evs []protocol.SessionEvent, reqs []fakeopenai.Request) {
				if r := toolResults(t, evs); len(r) != 2 || r[0].IsError || r[1].IsError {
					t.Fatalf("tool results %+v", r)
				}
				if got := reqs[1].Messages[1].ToolCalls; len(got) != 2 || got[0].Arguments != "{}" || got[1].Arguments != `{"path":"."}` {
					t.Fatalf("replayed calls %+v", got)
				}
			}},
		{name: "arguments that are not valid JSON",
			turn1: []fakeopenai.Reply{fakeopenai.Calls(call("A", `{"path": "x`)), fakeopenai.Say("sorry")},
			want1: protocol.TurnCompleted,
			check: func(t *testing.T, evs []protocol.SessionEvent, reqs []fakeopenai.Request) {
				calls := toolCalls(t, evs)
				if len(calls) != 1 || calls[0].Arguments != `{"path": "x` {
					t.Fatalf("the log must keep the raw arguments: %+v", calls)
				}
				r := toolResults(t, evs)
				if len(r) != 1 || !r[0].IsError || !strings.Contains(protocol.PlainText(r[0].Content), `invalid arguments: they are not valid JSON`) ||
					!strings.Contains(protocol.PlainText(r[0].Content), `You sent: {"path": "x`) {
					t.Fatalf("result %+v", r)
				}
				if got := reqs[1].Messages[1].ToolCalls; len(got) != 1 || got[0].Arguments != "{}" {
					t.Fatalf("replayed call %+v, want arguments {}", got)
				}
			}},
		{name: "arguments that are JSON but not an object",
			turn1: []fakeopenai.Reply{fakeopenai.Calls(call("A", `["."]`)), fakeopenai.Say("sorry")},
			want1: protocol.TurnCompleted,
			check: func(t *testing.T, evs []protocol.SessionEvent, _ []fakeopenai.Request) {
				if r := toolResults(t, evs); len(r) != 1 || !r[0].IsError || !strings.Contains(protocol.PlainText(r[0].Content), "not a JSON object") {
					t.Fatalf("result %+v", r)
				}
			}},
		{name: "an answer cut at the token limit inside a call",
			turn1: []fakeopenai.Reply{{Text: "Let me", Calls: []fakeopenai.Call{call("A", `{"pa`)}, Finish: "length"}},
			want1: protocol.TurnMaxTokens,
			check: func(t *testing.T, evs []protocol.SessionEvent, reqs []fakeopenai.Request) {
				last := reqs[len(reqs)-1].Messages
				if m := last[1]; m.Role != "assistant" || len(m.ToolCalls) != 0 || m.Content == nil || *m.Content != "Let me" {
					t.Fatalf("the cut message replays as %+v", m)
				}
			}},
		{name: "deepseek thinking mode with tool calls",
			thinking: true,
			turn1: []fakeopenai.Reply{{Reasoning: ptrS(""), Calls: []fakeopenai.Call{call("A", "{}")}},
				{Reasoning: ptrS("look again"), Calls: []fakeopenai.Call{call("B", "{}")}}, fakeopenai.Say("done")},
			want1: protocol.TurnCompleted,
			check: func(t *testing.T, _ []protocol.SessionEvent, reqs []fakeopenai.Request) {
				last := reqs[len(reqs)-1].Messages
				if last[1].Reasoning != `""` || last[3].Reasoning != `"look again"` {
					t.Fatalf("reasoning_content echoed as %q and %q", last[1].Reasoning, last[3].Reasoning)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := fakeopenai.New(t, fakeopenai.Config{Thinking: tt.thinking}, tt.turn1...)
			log := &memLog{}
			a := newTestAgent(t, strictModel(t, srv), log, t.TempDir())
			out := a.RunTurn(context.Background(), userInput("look"))
			if out.Reason.Kind != tt.want1 {
				t.Fatalf("turn 1 ended %+v; rejections %q", out.Reason, srv.Rejections())
			}
			// The next turn replays the whole log to the server.
			srv.Push(fakeopenai.Say("again"))
			if out := a.RunTurn(context.Background(), userInput("and now?")); out.Reason.Kind != protocol.TurnCompleted {
				t.Fatalf("turn 2 ended %+v; rejections %q", out.Reason, srv.Rejections())
			}
			if rej := srv.Rejections(); len(rej) > 0 {
				t.Fatalf("the strict server refused requests: %q", rej)
			}
			evs := a.Events()
			if err := sessionlog.ValidateReplay(evs, false); err != nil {
				t.Fatalf("the log does not replay: %v", err)
			}
			tt.check(t, evs, srv.Requests())
		})
	}
}

func toolCalls(t *testing.T, evs []protocol.SessionEvent) []protocol.ToolCallData {
	t.Helper()
	var out []protocol.ToolCallData
	for _, ev := range evs {
		if ev.Type == protocol.EvToolCall {
			var d protocol.ToolCallData
			if err := ev.Decode(&d); err != nil {
				t.Fatal(err)
			}
			out = append(out, d)
		}
	}
	return out
}

func toolResults(t *testing.T, evs []protocol.SessionEvent) []protocol.ToolResultData {
	t.Helper()
	var out []protocol.ToolResultData
	for _, ev := range evs {
		if ev.Type == protocol.EvToolResult {
			var d protocol.ToolResultData
			if err := ev.Decode(&d); err != nil {
				t.Fatal(err)
			}
			out = append(out, d)
		}
	}
	return out
}

// TestSubagentHiddenAtTheDepthCap: a session that could only get
// DEPTH_EXCEEDED from the subagent tool is not offered it (issue 14, item 4).
func TestSubagentHiddenAtTheDepthCap(t *testing.T) {
	capAt := func(n int64) *int64 { return &n }
	tests := []struct {
		name     string
		h        protocol.SessionHeader
		managed  bool
		offered  bool
		maxDepth int64
	}{
		{"root", protocol.SessionHeader{}, false, true, 0},
		{"below the tool's default cap", protocol.SessionHeader{DelegationDepth: 2}, false, true, 0},
		{"at the tool's default cap of 3", protocol.SessionHeader{DelegationDepth: 3}, false, false, 0},
		{"at the header's cap", protocol.SessionHeader{DelegationDepth: 1, DepthCap: capAt(1)}, false, false, 0},
		{"below the header's cap", protocol.SessionHeader{DelegationDepth: 1, DepthCap: capAt(2)}, false, true, 0},
		{"a tool cap of 5 lets depth 3 delegate", protocol.SessionHeader{DelegationDepth: 3}, false, true, 5},
		{"provider-managed: only the header counts", protocol.SessionHeader{DelegationDepth: 9}, true, true, 0},
		{"provider-managed at the header's cap", protocol.SessionHeader{DelegationDepth: 2, DepthCap: capAt(2)}, true, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg, err := NewRegistry(ListDirTool(AnyWorkspace), SubagentTool(SubagentConfig{Provider: "spawn", MaxDepth: tt.maxDepth, ProviderManaged: tt.managed}))
			if err != nil {
				t.Fatal(err)
			}
			_, offered := reg.ForSession(tt.h).Lookup("subagent")
			if offered != tt.offered {
				t.Fatalf("subagent offered = %v, want %v", offered, tt.offered)
			}
			if _, ok := reg.ForSession(tt.h).Lookup("list_dir"); !ok {
				t.Fatal("list_dir was dropped")
			}
		})
	}
}

// TestOutputSaysWhichMessageItCameFrom is issue 14, item 9: the output rule
// skips an empty last message, and the result says so.
func TestOutputSaysWhichMessageItCameFrom(t *testing.T) {
	srv := fakeopenai.New(t, fakeopenai.Config{},
		fakeopenai.Reply{Text: "Let me look first.", Calls: []fakeopenai.Call{{ID: "a", Name: "list_dir", Arguments: "{}"}}},
		fakeopenai.Say(""))
	a := newTestAgent(t, strictModel(t, srv), &memLog{}, t.TempDir())
	if out := a.RunTurn(context.Background(), userInput("look")); out.Reason.Kind != protocol.TurnCompleted {
		t.Fatalf("turn ended %+v", out.Reason)
	}
	evs := a.Events()
	res := sessionlog.OneShotOutcome(evs, false, false)
	if res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != "Let me look first." {
		t.Fatalf("result %+v", res)
	}
	f := res.OutputFrom
	if f == nil || f.Last || f.Turn != 1 || f.Step != 1 || evs[f.Seq].Type != protocol.EvAssistantMessage {
		t.Fatalf("outputFrom %+v", f)
	}
	tool := resultToTool("child", res)
	if text := protocol.PlainText(tool.Content); !strings.Contains(text, "Let me look first.") || !strings.Contains(text, "from turn 1, step 1; its last message was empty") {
		t.Fatalf("tool result %q", text)
	}
	// A last message with text is the output and says it is the last.
	srv.Push(fakeopenai.Say("All done."))
	a.RunTurn(context.Background(), userInput("finish"))
	res = sessionlog.EpochOutcome(a.Events())
	if protocol.PlainText(res.Output) != "All done." || res.OutputFrom == nil || !res.OutputFrom.Last || res.OutputFrom.Turn != 2 {
		t.Fatalf("epoch result %+v %+v", res, res.OutputFrom)
	}
	if text := protocol.PlainText(resultToTool("child", res).Content); text != "All done." {
		t.Fatalf("tool result %q", text)
	}
	if res := sessionlog.OneShotOutcome(nil, false, false); res.OutputFrom != nil {
		t.Fatalf("no output, yet outputFrom %+v", res.OutputFrom)
	}
}
