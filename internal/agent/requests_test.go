package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestParkedCallRunsOnlyWhenApproved (issue 33, item 1): a call that needs
// approval parks on a request; it runs only when approved, otherwise its
// result is the denial (who, why) or the timeout; the log holds call,
// request/open, request/answer, result in order; a turn cancelled while
// parked logs no answer, and ends at once, a read of its request in
// flight then (one that ignores its context) not waited for.
func TestParkedCallRunsOnlyWhenApproved(t *testing.T) {
	tests := []struct {
		name    string
		req     *testutil.Requests
		cancel  bool
		written bool
		result  string
		trail   string
	}{
		{"approved", &testutil.Requests{State: protocol.RequestApproved, Polls: 2}, false, true, "wrote 2 bytes", "tool/call request/open request/answer tool/result"},
		{"denied", &testutil.Requests{State: protocol.RequestDenied, Reason: "no", Polls: 2}, false, false, "denied by the user: no", "tool/call request/open request/answer tool/result"},
		{"timed out", &testutil.Requests{State: protocol.RequestTimedOut, Polls: 2}, false, false, "timed out, which counts as a denial", "tool/call request/open request/answer tool/result"},
		{"the request cannot be opened", &testutil.Requests{OpenErr: errors.New("UNAVAILABLE: down")}, false, false, "could not be opened", "tool/call tool/result"},
		{"cancelled while parked", &testutil.Requests{}, true, false, "", "tool/call request/open"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := t.TempDir()
			reg, err := NewRegistry(WriteFileTool(ws))
			must(t, err)
			log := &memLog{}
			a, err := New(Config{Header: protocol.SessionHeader{ID: "S1", Cwd: ws}, Credential: "cred", Log: log, Model: model.NewScripted(), Tools: reg, Requests: tt.req})
			must(t, err)
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			release := func() {}
			if tt.cancel {
				// Cancel once the call is parked: its request/open is
				// logged before the request's first read. That read
				// ignores the cancel and returns only once the turn ended.
				hold := make(chan struct{})
				release = sync.OnceFunc(func() { close(hold) })
				defer release()
				tt.req.Reading, tt.req.Hold = make(chan struct{}), hold
				go func() {
					select {
					case <-tt.req.Reading:
						cancel(&Cancel{Cause: protocol.CauseDisposed})
					case <-ctx.Done():
					}
				}()
			}
			var out Outcome
			ended := make(chan struct{})
			go func() {
				defer close(ended)
				out = a.RunTurn(ctx, userInput(`call write_file {"path":"x.txt","content":"hi"}`+"\nsay done"))
			}()
			select {
			case <-ended:
			case <-time.After(10 * time.Second):
				release()
				<-ended
				t.Fatal("the cancelled turn ended only once its request's read in flight returned")
			}
			release()
			var trail []string
			var res protocol.ToolResultData
			for _, ev := range a.Events() {
				switch ev.Type {
				case protocol.EvToolCall, protocol.EvRequestOpen, protocol.EvRequestAnswer:
					trail = append(trail, ev.Type)
				case protocol.EvToolResult:
					trail = append(trail, ev.Type)
					must(t, ev.Decode(&res))
				}
			}
			if tt.cancel {
				if out.Reason.Kind != protocol.TurnAborted || strings.Join(trail, " ") != "tool/call request/open tool/result" {
					t.Fatalf("cancelled: outcome %+v, trail %v", out, trail)
				}
				return
			}
			if out.Reason.Kind != protocol.TurnCompleted || strings.Join(trail, " ") != tt.trail {
				t.Fatalf("outcome %+v, trail %v; want completed, %s", out, trail, tt.trail)
			}
			if res.IsError == tt.written || !strings.Contains(protocol.PlainText(res.Content), tt.result) {
				t.Fatalf("result (error %v) %q, want %q", res.IsError, protocol.PlainText(res.Content), tt.result)
			}
			if _, err := os.Stat(filepath.Join(ws, "x.txt")); (err == nil) != tt.written {
				t.Fatalf("written %v, want %v", err == nil, tt.written)
			}
			if opened := tt.req.Opened(); len(opened) != 1 || opened[0].Self.Credential != "cred" || opened[0].Tool != "write_file" {
				t.Fatalf("opened %+v", opened)
			}
		})
	}
}

// TestAskParksOnAQuestion (issue 33, item 2(b)): a child's ask call opens
// a question (its text, choices, answerSchema) with the child's own
// credential and parks; the answer, text or JSON text, becomes the call's
// result, logged call, request/open, request/answer (with the answer),
// result; a timeout is an error result saying no answer came; a question
// the protocol refuses is never opened; a filter that denies ask removes
// it like any tool; a session that cannot ask gets an error result.
func TestAskParksOnAQuestion(t *testing.T) {
	const schema = `{"type":"object","properties":{"n":{"type":"integer"}}}`
	tests := []struct {
		name    string
		call    string
		req     *testutil.Requests
		deny    bool // a tool filter denies ask
		noAsk   bool // the session has no Requester
		isError bool
		result  string
		trail   string
	}{
		{"a text answer", `call ask {"question":"Which one?","choices":["a","b"]}`, &testutil.Requests{State: protocol.RequestAnswered, Text: "b", Polls: 2},
			false, false, false, "b", "tool/call request/open request/answer tool/result"},
		{"a JSON answer", `call ask {"question":"How many?","answerSchema":` + schema + `}`, &testutil.Requests{State: protocol.RequestAnswered, JSON: `{"n":3}`, Polls: 2},
			false, false, false, `{"n":3}`, "tool/call request/open request/answer tool/result"},
		{"no answer in time", `call ask {"question":"Anyone?"}`, &testutil.Requests{State: protocol.RequestTimedOut, Polls: 2},
			false, false, true, "no answer came", "tool/call request/open request/answer tool/result"},
		{"choices and a schema", `call ask {"question":"Which?","choices":["a"],"answerSchema":` + schema + `}`, &testutil.Requests{},
			false, false, true, "choices or an answerSchema, not both", "tool/call tool/result"},
		{"no question", `call ask {"choices":["a","b"]}`, &testutil.Requests{},
			false, false, true, "needs its text", "tool/call tool/result"},
		{"the question cannot be asked", `call ask {"question":"Q?"}`, &testutil.Requests{OpenErr: errors.New("UNAVAILABLE: down")},
			false, false, true, "could not be asked", "tool/call tool/result"},
		{"denied by a filter", `call ask {"question":"Q?"}`, &testutil.Requests{},
			true, false, true, `unknown tool "ask"`, "tool/call tool/result"},
		{"a session that cannot ask", `call ask {"question":"Q?"}`, nil,
			false, true, true, "cannot ask anyone", "tool/call tool/result"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg, err := NewRegistry(AskTool())
			must(t, err)
			if tt.deny {
				reg, err = reg.Restrict(protocol.ToolFilter{Deny: []string{AskToolName}})
				must(t, err)
			}
			cfg := Config{Header: protocol.SessionHeader{ID: "S1"}, Credential: "cred", Log: &memLog{}, Model: model.NewScripted(), Tools: reg}
			if !tt.noAsk {
				cfg.Requests = tt.req
			}
			a, err := New(cfg)
			must(t, err)
			out := a.RunTurn(context.Background(), userInput(tt.call+"\nsay done"))
			var trail []string
			var res protocol.ToolResultData
			var ans protocol.RequestAnswerData
			for _, ev := range a.Events() {
				switch ev.Type {
				case protocol.EvToolCall, protocol.EvRequestOpen:
					trail = append(trail, ev.Type)
				case protocol.EvRequestAnswer:
					trail = append(trail, ev.Type)
					must(t, ev.Decode(&ans))
				case protocol.EvToolResult:
					trail = append(trail, ev.Type)
					must(t, ev.Decode(&res))
				}
			}
			if out.Reason.Kind != protocol.TurnCompleted || strings.Join(trail, " ") != tt.trail {
				t.Fatalf("outcome %+v, trail %v; want completed, %s", out, trail, tt.trail)
			}
			text := protocol.PlainText(res.Content)
			if res.IsError != tt.isError || !strings.Contains(text, tt.result) || (!tt.isError && text != tt.result) {
				t.Fatalf("result (error %v) %q, want (error %v) %q", res.IsError, text, tt.isError, tt.result)
			}
			if tt.trail != "tool/call request/open request/answer tool/result" {
				return
			}
			opened := tt.req.Opened()
			if len(opened) != 1 {
				t.Fatalf("opened %+v, want one question", opened)
			}
			o := opened[0]
			if o.Kind != protocol.RequestQuestion || o.Self.Credential != "cred" || o.Question == "" || o.Tool != "" {
				t.Fatalf("opened %+v, want a question with the session's credential", o)
			}
			if ans.State != tt.req.State || ans.Text != tt.req.Text || ans.JSON != tt.req.JSON {
				t.Fatalf("request/answer %+v, want state %s text %q json %q", ans, tt.req.State, tt.req.Text, tt.req.JSON)
			}
		})
	}
}
