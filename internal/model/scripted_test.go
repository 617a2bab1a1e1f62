package model

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

func user(text string) Message { return Message{Role: RoleUser, Content: protocol.Text(text)} }
func assistant() Message       { return Message{Role: RoleAssistant} }

// on is a script with on lines: a notice naming a request is answered by
// two calls, then a say; anything else is echoed.
const on = "on /request (r[0-9a-f]+)/ call answer_request {\"requestId\":\"$1\"}\n" +
	"on /^Subagent (\\S+) asks/ call list_dir {\"path\":\"$1\"}\n" +
	"on /request (r[0-9a-f]+)/ say answered $1\n" +
	"say started"

func TestScriptedAnswers(t *testing.T) {
	tests := []struct {
		name      string
		msgs      []Message
		wantText  string
		wantCalls []protocol.ToolCall
		wantFin   Finish
		wantErr   string
		wantUsage protocol.Usage // one token per word (ScriptedUsage)
	}{
		{"plain text echoes", []Message{user("hello there")}, "echo: hello there", nil, FinishStop, "", protocol.Usage{InputTokens: 2, OutputTokens: 3}},
		{"say", []Message{user("say hi")}, "hi", nil, FinishStop, "", protocol.Usage{InputTokens: 2, OutputTokens: 1}},
		{"call group then say", []Message{user("call list_dir {}\ncall list_dir {\"path\":\"x\"}\nsay done")}, "",
			[]protocol.ToolCall{{ID: "call_1_0", Name: "list_dir", Arguments: "{}"}, {ID: "call_1_1", Name: "list_dir", Arguments: `{"path":"x"}`}}, FinishToolCalls, "", protocol.Usage{InputTokens: 8, OutputTokens: 4}},
		{"second request continues after the calls", []Message{user("call list_dir {}\nsay done"), assistant(), {Role: RoleTool}}, "done", nil, FinishStop, "", protocol.Usage{InputTokens: 5, OutputTokens: 1}},
		{"lines run out", []Message{user("say one"), assistant()}, "", nil, FinishStop, "", protocol.Usage{InputTokens: 2, OutputTokens: 0}},
		{"json calls structured_output", []Message{user(`json {"answer":42}`)}, "",
			[]protocol.ToolCall{{ID: "call_1_0", Name: StructuredOutputTool, Arguments: `{"answer":42}`}}, FinishToolCalls, "", protocol.Usage{InputTokens: 2, OutputTokens: 2}},
		{"fail", []Message{user("fail boom")}, "", nil, "", "boom", protocol.Usage{}},
		{"refuse", []Message{user("refuse")}, "", nil, FinishRefusal, "", protocol.Usage{InputTokens: 1, OutputTokens: 0}},
		{"max-tokens", []Message{user("max-tokens part")}, "part", nil, FinishLength, "", protocol.Usage{InputTokens: 2, OutputTokens: 1}},
		{"typo is loud", []Message{user("say a\nsya b")}, "", nil, "", `line 2 "sya b" is not a directive`, protocol.Usage{}},
		{"framing is ignored", []Message{{Role: RoleUser, Content: []protocol.ContentBlock{
			{Type: "text", Text: "note: inherited context", Framing: true}, {Type: "text", Text: "say ok"}}}}, "ok", nil, FinishStop, "", protocol.Usage{InputTokens: 5, OutputTokens: 1}},
		{"sleep then say", []Message{user("sleep 1ms\nsay late")}, "late", nil, FinishStop, "", protocol.Usage{InputTokens: 4, OutputTokens: 1}},
		{"on lines take no request", []Message{user("on /x/ say never\nsay first")}, "first", nil, FinishStop, "", protocol.Usage{InputTokens: 6, OutputTokens: 1}},
		{"a notice an on line matches is answered by it, expanded", []Message{user(on), assistant(), user("Subagent S asks (request r1f)."), assistant(), {Role: RoleTool}, user("Subagent S asks (request r2a).")}, "",
			[]protocol.ToolCall{{ID: "call_6_0", Name: "answer_request", Arguments: `{"requestId":"r2a"}`}, {ID: "call_6_1", Name: "list_dir", Arguments: `{"path":"S"}`}}, FinishToolCalls, "", protocol.Usage{InputTokens: 31, OutputTokens: 4}},
		{"the matching on lines go on as a script", []Message{user(on), user("Subagent S asks (request r2a)."), assistant(), {Role: RoleTool}}, "answered r2a", nil, FinishStop, "", protocol.Usage{InputTokens: 26, OutputTokens: 2}},
		{"a notice no on line matches is echoed", []Message{user(on), user("Subagent S is done.")}, "echo: Subagent S is done.", nil, FinishStop, "", protocol.Usage{InputTokens: 25, OutputTokens: 5}},
		{"an on line needs a regexp and a directive", []Message{user("say a\non x say a")}, "", nil, "", "line 2: on needs /<regexp>/ and a directive", protocol.Usage{}},
		{"plain text may begin with on", []Message{user("on second thought")}, "echo: on second thought", nil, FinishStop, "", protocol.Usage{InputTokens: 3, OutputTokens: 4}},
		{"an on line's regexp must compile", []Message{user("on /(/ say a")}, "", nil, "", "line 1: error parsing regexp", protocol.Usage{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var streamed string
			resp, err := NewScripted().Stream(context.Background(), Request{Messages: tt.msgs}, func(s string) { streamed += s })
			if tt.wantErr != "" {
				var me *Error
				if !errors.As(err, &me) || !strings.Contains(me.Diagnostic, tt.wantErr) {
					t.Fatalf("err = %v, want model error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if resp.Usage == nil || *resp.Usage != tt.wantUsage {
				t.Errorf("usage = %+v, want %+v", resp.Usage, tt.wantUsage)
			}
			if got := protocol.PlainText(resp.Message.Content); got != tt.wantText {
				t.Errorf("text = %q, want %q", got, tt.wantText)
			}
			if streamed != tt.wantText {
				t.Errorf("streamed = %q, want %q", streamed, tt.wantText)
			}
			if resp.Finish != tt.wantFin {
				t.Errorf("finish = %q, want %q", resp.Finish, tt.wantFin)
			}
			if len(resp.Message.ToolCalls) != len(tt.wantCalls) {
				t.Fatalf("calls = %+v, want %+v", resp.Message.ToolCalls, tt.wantCalls)
			}
			for i := range tt.wantCalls {
				if resp.Message.ToolCalls[i] != tt.wantCalls[i] {
					t.Errorf("call %d = %+v, want %+v", i, resp.Message.ToolCalls[i], tt.wantCalls[i])
				}
			}
		})
	}
}

func TestScriptedSleepHonoursCancellation(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	start := time.Now()
	_, err := NewScripted().Stream(ctx, Request{Messages: []Message{user("sleep 10s\nsay never")}}, func(string) {})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("sleep ignored the cancellation")
	}
}
