package acpbridge

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/provider"
)

// trail renders the log's tool calls, results, requests and permissions
// of a turn, in order.
func trail(t *testing.T, evs []protocol.SessionEvent) string {
	t.Helper()
	var out []string
	for _, ev := range evs {
		switch ev.Type {
		case protocol.EvToolCall, protocol.EvToolResult, protocol.EvRequestOpen, protocol.EvRequestAnswer, protocol.EvACPPermission:
			out = append(out, ev.Type)
		}
	}
	return strings.Join(out, " ")
}

// TestSessionAskRoutesPermissions (issue 33, item 2c): under the ask
// policy a permission request becomes a request for approval of the tool
// call, opened with the child's own credential (its callId the logged
// call's, its tool the call's title, its arguments the call's raw input),
// logged request/open and request/answer as a built-in agent's; the
// answer selects the agent's option: approved its allow option (the agent
// goes on and writes), denied or timed out its reject option (it does
// not), with the `cancelled` outcome when no offered option fits; a
// request that cannot be opened is a denial. The acp/permission event
// and the result's permissions say how it was answered.
func TestSessionAskRoutesPermissions(t *testing.T) {
	user := protocol.Answerer{Kind: protocol.AnswererUser}
	tests := []struct {
		name    string
		prompt  string
		req     *testutil.Requests
		out     string
		written bool
		granted bool
		trail   string
		why     string
	}{
		{"approved", "write x.txt hi", &testutil.Requests{State: protocol.RequestApproved, By: user, Polls: 2}, "selected yes", true, true,
			"tool/call request/open request/answer acp/permission tool/result", "approved by the user"},
		{"denied", "write x.txt hi", &testutil.Requests{State: protocol.RequestDenied, By: protocol.Answerer{Kind: protocol.AnswererAgent, SessionID: "P1"}, Reason: "not now", Polls: 2},
			"selected no", false, false, "tool/call request/open request/answer acp/permission tool/result", "denied by the agent P1 (an ancestor): not now"},
		{"timed out", "write x.txt hi", &testutil.Requests{State: protocol.RequestTimedOut, By: protocol.Answerer{Kind: protocol.AnswererTimeout}, Polls: 1},
			"selected no", false, false, "tool/call request/open request/answer acp/permission tool/result", "timed out, which counts as a denial"},
		{"the request cannot be opened", "write x.txt hi", &testutil.Requests{OpenErr: errors.New("UNAVAILABLE: no coordinator")},
			"selected no", false, false, "tool/call acp/permission tool/result", "could not be opened (UNAVAILABLE: no coordinator), which counts as a denial"},
		{"approved, only allow_always offered", "permission-always", &testutil.Requests{State: protocol.RequestApproved, By: user, Polls: 1},
			"selected always", false, true, "tool/call request/open request/answer acp/permission tool/result", "approved by the user"},
		{"cancelled: its turn ended", "permission", &testutil.Requests{State: protocol.RequestCancelled, By: protocol.Answerer{Kind: protocol.AnswererEnded}, Reason: "its turn 1 ended aborted (user) before an answer came", Polls: 1},
			"cancelled", false, false, "tool/call request/open request/answer acp/permission tool/result", "was cancelled: its turn 1 ended aborted (user)"},
		{"denied, no reject option offered", "permission-allow-only", &testutil.Requests{State: protocol.RequestDenied, By: user, Polls: 1},
			"cancelled", false, false, "tool/call request/open request/answer acp/permission tool/result", "no option of kind reject_once or reject_always"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := testOptions(t)
			tt.req.Credential, tt.req.Deadline = "child-cred", 42
			o.Requests = tt.req
			p, err := NewProvider(AgentConfig{Name: "fake", Command: fakeAgent(t), Permission: PolicyAsk}, o)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			log := &memLog{}
			s, _ := p.NewSession(context.Background(), provider.SessionSpec{Header: protocol.SessionHeader{ID: "child-1", Cwd: dir}, Credential: "child-cred", Log: log})
			r, out := turn(t, s, log, tt.prompt)
			_ = s.(provider.Closer).Close()
			if r.Kind != protocol.TurnCompleted || out != tt.out {
				t.Fatalf("turn %+v %q, want %q", r, out, tt.out)
			}
			if _, err := os.Stat(filepath.Join(dir, "x.txt")); (err == nil) != tt.written {
				t.Fatalf("x.txt written: %v, want %v", err == nil, tt.written)
			}
			evs := log.events()
			if got := trail(t, evs); got != tt.trail {
				t.Fatalf("log %s\nwant %s", got, tt.trail)
			}
			opened := tt.req.Opened()
			if len(opened) != 1 {
				t.Fatalf("%d requests opened, want 1", len(opened))
			}
			req := opened[0]
			if req.Self.SessionID != "child-1" || req.Self.Credential != "child-cred" || req.Kind != protocol.RequestApproval || req.Turn != 1 || req.Step != 1 {
				t.Fatalf("request %+v", req)
			}
			if tt.prompt == "write x.txt hi" && (req.CallID != "w1" || req.Tool != "Write x.txt" || req.Arguments != `{"content":"hi","path":"x.txt"}`) {
				t.Fatalf("request %+v, want the call w1 Write x.txt with its raw input", req)
			}
			if tt.prompt != "write x.txt hi" && (req.CallID != "p1" || req.Tool != "Write a file" || req.Arguments != "{}") {
				t.Fatalf("request %+v, want the call p1 Write a file without input", req)
			}
			var open protocol.RequestOpenData
			var answer protocol.RequestAnswerData
			for _, ev := range evs {
				switch ev.Type {
				case protocol.EvRequestOpen:
					_ = ev.Decode(&open)
				case protocol.EvRequestAnswer:
					_ = ev.Decode(&answer)
				}
			}
			if tt.req.OpenErr == nil && (open.RequestID != protocol.RequestID("child-1", req.CallID) || open.CallID != req.CallID || open.Tool != req.Tool ||
				open.Deadline != 42 || answer.RequestID != open.RequestID || answer.State != tt.req.State || answer.Reason != tt.req.Reason) {
				t.Fatalf("request/open %+v, request/answer %+v", open, answer)
			}
			perms := permissions(t, evs)
			if len(perms) != 1 || perms[0].Policy != string(PolicyAsk) || perms[0].Granted != tt.granted || perms[0].Turn != 1 || perms[0].Late ||
				!strings.Contains(perms[0].Why, tt.why) {
				t.Fatalf("acp/permission %+v, want granted %v, why with %q", perms, tt.granted, tt.why)
			}
			want := protocol.PermissionCounts{Requested: 1, Denied: 1}
			if tt.granted {
				want = protocol.PermissionCounts{Requested: 1, Granted: 1}
			}
			if res := sessionlog.OneShotOutcome(evs, false, false); res.Permissions == nil || *res.Permissions != want {
				t.Fatalf("result permissions %+v, want %+v", res.Permissions, want)
			}
			if err := sessionlog.ValidateReplay(evs, false); err != nil {
				t.Fatalf("the log does not replay: %v", err)
			}
		})
	}
}

// TestSessionAskWaitsOutSilenceAndCancel: an agent waiting for an answer
// is not silent (its silence bound is far shorter than the wait); a turn
// cancelled while the request waits answers the agent `cancelled`, logs
// the request's acp/permission in that turn (no request/answer: no one
// answered), and ends aborted at once: a read of the request in flight
// then, one that ignores its context, is not waited for.
func TestSessionAskWaitsOutSilenceAndCancel(t *testing.T) {
	user := protocol.Answerer{Kind: protocol.AnswererUser}
	t.Run("an answer after the silence bound", func(t *testing.T) {
		o := testOptions(t)
		o.SilenceTimeout = 500 * time.Millisecond
		// Reads at 0.25, 0.75, 1.75, 3.75 s: the answer comes past the bound.
		o.Requests = &testutil.Requests{Credential: "child-cred", State: protocol.RequestApproved, By: user, Polls: 4}
		p, err := NewProvider(AgentConfig{Name: "fake", Command: fakeAgent(t), Permission: PolicyAsk}, o)
		if err != nil {
			t.Fatal(err)
		}
		log := &memLog{}
		s, _ := p.NewSession(context.Background(), provider.SessionSpec{Header: protocol.SessionHeader{ID: "child-1", Cwd: t.TempDir()}, Credential: "child-cred", Log: log})
		defer s.(provider.Closer).Close()
		start := time.Now()
		if r, out := turn(t, s, log, "permission"); r.Kind != protocol.TurnCompleted || out != "selected yes" {
			t.Fatalf("turn %+v %q", r, out)
		}
		if took := time.Since(start); took < 3*time.Second {
			t.Fatalf("the turn took %s: the answer came before the silence bound, the test proves nothing", took)
		}
	})
	t.Run("the turn is cancelled while the request waits", func(t *testing.T) {
		o := testOptions(t)
		// Never answered; its read in flight when the turn ends ignores
		// that end and returns only once the test has seen the turn end.
		hold := make(chan struct{})
		release := sync.OnceFunc(func() { close(hold) })
		req := &testutil.Requests{Credential: "child-cred", Hold: hold}
		o.Requests = req
		p, err := NewProvider(AgentConfig{Name: "fake", Command: fakeAgent(t), Permission: PolicyAsk}, o)
		if err != nil {
			t.Fatal(err)
		}
		log := &memLog{}
		s, _ := p.NewSession(context.Background(), provider.SessionSpec{Header: protocol.SessionHeader{ID: "child-1", Cwd: t.TempDir()}, Credential: "child-cred", Log: log})
		defer s.(provider.Closer).Close()
		defer release() // before the close: a failed test lets the read return
		ctx, cancel := context.WithCancelCause(context.Background())
		if out, ok := s.OpenTurn(ctx, provider.Input{Content: protocol.Text("permission")}); !ok {
			t.Fatalf("open turn: %+v", out)
		}
		done := make(chan provider.Outcome, 1)
		go func() { done <- s.RunSteps(ctx) }()
		testutil.Eventually(t, 10*time.Second, func() bool {
			return strings.Contains(trail(t, log.events()), protocol.EvRequestOpen) && req.Reads() > 0
		}, "the request is opened, logged and being read")
		cancel(&provider.Cancel{Cause: protocol.CauseUser})
		var out provider.Outcome
		select {
		case out = <-done:
		case <-time.After(10 * time.Second):
			release()
			<-done
			t.Fatal("the cancelled turn ended only once its request's read in flight returned")
		}
		release()
		if out.Reason.Kind != protocol.TurnAborted || out.Reason.Cause != protocol.CauseUser {
			t.Fatalf("turn %+v, want aborted (user)", out)
		}
		evs := log.events()
		if got, want := trail(t, evs), "tool/call request/open acp/permission tool/result"; got != want {
			t.Fatalf("log %s\nwant %s", got, want)
		}
		perms := permissions(t, evs)
		if len(perms) != 1 || perms[0].Outcome != "cancelled" || perms[0].Granted || perms[0].Late || perms[0].Turn != 1 ||
			!strings.Contains(perms[0].Why, "the turn ended while request") {
			t.Fatalf("acp/permission %+v", perms)
		}
		if len(req.Opened()) != 1 {
			t.Fatalf("requests opened: %+v", req.Opened())
		}
		if err := sessionlog.ValidateReplay(evs, false); err != nil {
			t.Fatalf("the log does not replay: %v", err)
		}
	})
}

// TestSessionAskNeedsARequester: an ask agent without a way to ask is
// refused when its provider is built; a tool ceiling that denies any tool
// rejects without asking.
func TestSessionAskNeedsARequester(t *testing.T) {
	if _, err := NewProvider(AgentConfig{Name: "fake", Command: "x", Permission: PolicyAsk}, testOptions(t)); err == nil || !strings.Contains(err.Error(), "Options.Requests") {
		t.Fatalf("NewProvider = %v, want the missing requests client named", err)
	}
	o := testOptions(t)
	req := &testutil.Requests{Credential: "child-cred", State: protocol.RequestApproved, Polls: 1}
	o.Requests = req
	p, err := NewProvider(AgentConfig{Name: "fake", Command: fakeAgent(t), Permission: PolicyAsk}, o)
	if err != nil {
		t.Fatal(err)
	}
	log := &memLog{}
	s, _ := p.NewSession(context.Background(), provider.SessionSpec{Header: protocol.SessionHeader{ID: "c", Cwd: t.TempDir(),
		ToolCeiling: &protocol.ToolFilter{Deny: []string{"read_file"}}}, Credential: "child-cred", Log: log})
	r, out := turn(t, s, log, "permission")
	_ = s.(provider.Closer).Close()
	if r.Kind != protocol.TurnCompleted || out != "selected no" || len(req.Opened()) != 0 {
		t.Fatalf("turn %+v %q, %d requests opened; want rejected without asking", r, out, len(req.Opened()))
	}
}
