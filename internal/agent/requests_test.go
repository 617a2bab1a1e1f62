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
	"github.com/brood-dev/brood/pkg/protocol"
)

// fakeRequester answers a request with state after polls reads.
type fakeRequester struct {
	mu      sync.Mutex
	openErr error
	state   string
	reason  string
	text    string // a question's answer
	json    string
	polls   int
	opened  []protocol.RequestOpenRequest
	// reading, when set, is closed at the first read of a request.
	reading chan struct{}
}

func (f *fakeRequester) OpenRequest(_ context.Context, r protocol.RequestOpenRequest) (protocol.RequestRecord, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opened = append(f.opened, r)
	if f.openErr != nil {
		return protocol.RequestRecord{}, f.openErr
	}
	return protocol.RequestRecord{ID: protocol.RequestID(r.Self.SessionID, r.CallID), SessionID: r.Self.SessionID, Kind: r.Kind,
		CallID: r.CallID, Tool: r.Tool, Arguments: r.Arguments, State: protocol.RequestPending, Deadline: 1}, nil
}

func (f *fakeRequester) GetRequest(_ context.Context, r protocol.RequestGetRequest) (protocol.RequestRecord, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.polls == 0 && f.reading != nil {
		close(f.reading)
	}
	f.polls++
	rec := protocol.RequestRecord{ID: r.RequestID, State: protocol.RequestPending}
	if f.polls >= 2 && f.state != "" {
		rec.State = f.state
		kind := protocol.AnswererUser
		if f.state == protocol.RequestTimedOut {
			kind = protocol.AnswererTimeout
		}
		rec.Answer = &protocol.RequestAnswer{State: f.state, Reason: f.reason, Text: f.text, JSON: f.json, By: protocol.Answerer{Kind: kind}}
	}
	return rec, nil
}

// TestParkedCallRunsOnlyWhenApproved (issue 33, item 1): a call that needs
// approval parks on a request; it runs only when approved, otherwise its
// result is the denial (who, why) or the timeout; the log holds call,
// request/open, request/answer, result in order; a turn cancelled while
// parked logs no answer.
func TestParkedCallRunsOnlyWhenApproved(t *testing.T) {
	tests := []struct {
		name    string
		req     *fakeRequester
		cancel  bool
		written bool
		result  string
		trail   string
	}{
		{"approved", &fakeRequester{state: protocol.RequestApproved}, false, true, "wrote 2 bytes", "tool/call request/open request/answer tool/result"},
		{"denied", &fakeRequester{state: protocol.RequestDenied, reason: "no"}, false, false, "denied by the user: no", "tool/call request/open request/answer tool/result"},
		{"timed out", &fakeRequester{state: protocol.RequestTimedOut}, false, false, "timed out, which counts as a denial", "tool/call request/open request/answer tool/result"},
		{"the request cannot be opened", &fakeRequester{openErr: errors.New("UNAVAILABLE: down")}, false, false, "could not be opened", "tool/call tool/result"},
		{"cancelled while parked", &fakeRequester{}, true, false, "", "tool/call request/open"},
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
			if tt.cancel {
				// Cancel once the call is parked (its request/open logged).
				go func() {
					for {
						for _, ev := range a.Events() {
							if ev.Type == protocol.EvRequestOpen {
								cancel(&Cancel{Cause: protocol.CauseDisposed})
								return
							}
						}
						if ctx.Err() != nil {
							return
						}
						time.Sleep(5 * time.Millisecond)
					}
				}()
			}
			out := a.RunTurn(ctx, userInput(`call write_file {"path":"x.txt","content":"hi"}`+"\nsay done"))
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
			if len(tt.req.opened) != 1 || tt.req.opened[0].Self.Credential != "cred" || tt.req.opened[0].Tool != "write_file" {
				t.Fatalf("opened %+v", tt.req.opened)
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
		req     *fakeRequester
		deny    bool // a tool filter denies ask
		noAsk   bool // the session has no Requester
		isError bool
		result  string
		trail   string
	}{
		{"a text answer", `call ask {"question":"Which one?","choices":["a","b"]}`, &fakeRequester{state: protocol.RequestAnswered, text: "b"},
			false, false, false, "b", "tool/call request/open request/answer tool/result"},
		{"a JSON answer", `call ask {"question":"How many?","answerSchema":` + schema + `}`, &fakeRequester{state: protocol.RequestAnswered, json: `{"n":3}`},
			false, false, false, `{"n":3}`, "tool/call request/open request/answer tool/result"},
		{"no answer in time", `call ask {"question":"Anyone?"}`, &fakeRequester{state: protocol.RequestTimedOut},
			false, false, true, "no answer came", "tool/call request/open request/answer tool/result"},
		{"choices and a schema", `call ask {"question":"Which?","choices":["a"],"answerSchema":` + schema + `}`, &fakeRequester{},
			false, false, true, "choices or an answerSchema, not both", "tool/call tool/result"},
		{"no question", `call ask {"choices":["a","b"]}`, &fakeRequester{},
			false, false, true, "needs its text", "tool/call tool/result"},
		{"the question cannot be asked", `call ask {"question":"Q?"}`, &fakeRequester{openErr: errors.New("UNAVAILABLE: down")},
			false, false, true, "could not be asked", "tool/call tool/result"},
		{"denied by a filter", `call ask {"question":"Q?"}`, &fakeRequester{},
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
			if len(tt.req.opened) != 1 {
				t.Fatalf("opened %+v, want one question", tt.req.opened)
			}
			o := tt.req.opened[0]
			if o.Kind != protocol.RequestQuestion || o.Self.Credential != "cred" || o.Question == "" || o.Tool != "" {
				t.Fatalf("opened %+v, want a question with the session's credential", o)
			}
			if ans.State != tt.req.state || ans.Text != tt.req.text || ans.JSON != tt.req.json {
				t.Fatalf("request/answer %+v, want state %s text %q json %q", ans, tt.req.state, tt.req.text, tt.req.json)
			}
		})
	}
}
