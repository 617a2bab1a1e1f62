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
	polls   int
	opened  []protocol.RequestOpenRequest
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
	f.polls++
	rec := protocol.RequestRecord{ID: r.RequestID, State: protocol.RequestPending}
	if f.polls >= 2 && f.state != "" {
		rec.State = f.state
		kind := protocol.AnswererUser
		if f.state == protocol.RequestTimedOut {
			kind = protocol.AnswererTimeout
		}
		rec.Answer = &protocol.RequestAnswer{State: f.state, Reason: f.reason, By: protocol.Answerer{Kind: kind}}
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
