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

// answerer is a coordinator's requests as the asking session sees them: a
// request opens pending, and reads of it return state (answered by by,
// with reason) from the polls-th read on; with no state it stays pending,
// and with slow a read of it returns only slow after its context ended (a
// call in flight when the turn ends).
type answerer struct {
	mu      sync.Mutex
	openErr error
	state   string
	by      protocol.Answerer
	reason  string
	polls   int
	slow    time.Duration
	reads   int
	opened  []protocol.RequestOpenRequest
}

func (a *answerer) OpenRequest(_ context.Context, r protocol.RequestOpenRequest) (protocol.RequestRecord, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.opened = append(a.opened, r)
	if a.openErr != nil {
		return protocol.RequestRecord{}, a.openErr
	}
	return protocol.RequestRecord{ID: protocol.RequestID(r.Self.SessionID, r.CallID), SessionID: r.Self.SessionID, Kind: r.Kind,
		CallID: r.CallID, Tool: r.Tool, Arguments: r.Arguments, State: protocol.RequestPending, Deadline: 42}, nil
}

func (a *answerer) GetRequest(ctx context.Context, r protocol.RequestGetRequest) (protocol.RequestRecord, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.Self == nil || r.Self.Credential != "child-cred" {
		return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeUnauthorized, "not the child's credential")
	}
	a.reads++
	if a.state == "" && a.slow > 0 {
		a.mu.Unlock()
		<-ctx.Done()
		time.Sleep(a.slow)
		a.mu.Lock()
		return protocol.RequestRecord{}, ctx.Err()
	}
	rec := protocol.RequestRecord{ID: r.RequestID, State: protocol.RequestPending}
	if a.state != "" && a.reads >= a.polls {
		rec.State = a.state
		rec.Answer = &protocol.RequestAnswer{State: a.state, Reason: a.reason, By: a.by}
	}
	return rec, nil
}

func (a *answerer) readCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reads
}

func (a *answerer) openedRequests() []protocol.RequestOpenRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]protocol.RequestOpenRequest(nil), a.opened...)
}

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
		req     *answerer
		out     string
		written bool
		granted bool
		trail   string
		why     string
	}{
		{"approved", "write x.txt hi", &answerer{state: protocol.RequestApproved, by: user, polls: 2}, "selected yes", true, true,
			"tool/call request/open request/answer acp/permission tool/result", "approved by the user"},
		{"denied", "write x.txt hi", &answerer{state: protocol.RequestDenied, by: protocol.Answerer{Kind: protocol.AnswererAgent, SessionID: "P1"}, reason: "not now", polls: 2},
			"selected no", false, false, "tool/call request/open request/answer acp/permission tool/result", "denied by the agent P1 (an ancestor): not now"},
		{"timed out", "write x.txt hi", &answerer{state: protocol.RequestTimedOut, by: protocol.Answerer{Kind: protocol.AnswererTimeout}, polls: 1},
			"selected no", false, false, "tool/call request/open request/answer acp/permission tool/result", "timed out, which counts as a denial"},
		{"the request cannot be opened", "write x.txt hi", &answerer{openErr: errors.New("UNAVAILABLE: no coordinator")},
			"selected no", false, false, "tool/call acp/permission tool/result", "could not be opened (UNAVAILABLE: no coordinator), which counts as a denial"},
		{"approved, only allow_always offered", "permission-always", &answerer{state: protocol.RequestApproved, by: user, polls: 1},
			"selected always", false, true, "tool/call request/open request/answer acp/permission tool/result", "approved by the user"},
		{"cancelled: its turn ended", "permission", &answerer{state: protocol.RequestCancelled, by: protocol.Answerer{Kind: protocol.AnswererEnded}, reason: "its turn 1 ended aborted (user) before an answer came", polls: 1},
			"cancelled", false, false, "tool/call request/open request/answer acp/permission tool/result", "was cancelled: its turn 1 ended aborted (user)"},
		{"denied, no reject option offered", "permission-allow-only", &answerer{state: protocol.RequestDenied, by: user, polls: 1},
			"cancelled", false, false, "tool/call request/open request/answer acp/permission tool/result", "no option of kind reject_once or reject_always"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := testOptions(t)
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
			opened := tt.req.openedRequests()
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
			if tt.req.openErr == nil && (open.RequestID != protocol.RequestID("child-1", req.CallID) || open.CallID != req.CallID || open.Tool != req.Tool ||
				open.Deadline != 42 || answer.RequestID != open.RequestID || answer.State != tt.req.state || answer.Reason != tt.req.reason) {
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
// answered), and ends aborted.
func TestSessionAskWaitsOutSilenceAndCancel(t *testing.T) {
	user := protocol.Answerer{Kind: protocol.AnswererUser}
	t.Run("an answer after the silence bound", func(t *testing.T) {
		o := testOptions(t)
		o.SilenceTimeout = 500 * time.Millisecond
		// Reads at 0.25, 0.75, 1.75, 3.75 s: the answer comes past the bound.
		o.Requests = &answerer{state: protocol.RequestApproved, by: user, polls: 4}
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
		req := &answerer{slow: 300 * time.Millisecond} // never answered; its read in flight ends late
		o.Requests = req
		p, err := NewProvider(AgentConfig{Name: "fake", Command: fakeAgent(t), Permission: PolicyAsk}, o)
		if err != nil {
			t.Fatal(err)
		}
		log := &memLog{}
		s, _ := p.NewSession(context.Background(), provider.SessionSpec{Header: protocol.SessionHeader{ID: "child-1", Cwd: t.TempDir()}, Credential: "child-cred", Log: log})
		defer s.(provider.Closer).Close()
		ctx, cancel := context.WithCancelCause(context.Background())
		if out, ok := s.OpenTurn(ctx, provider.Input{Content: protocol.Text("permission")}); !ok {
			t.Fatalf("open turn: %+v", out)
		}
		go func() {
			testutil.Eventually(t, 10*time.Second, func() bool {
				return strings.Contains(trail(t, log.events()), protocol.EvRequestOpen) && req.readCount() > 0
			}, "the request is opened, logged and being read")
			cancel(&provider.Cancel{Cause: protocol.CauseUser})
		}()
		out := s.RunSteps(ctx)
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
		if len(req.openedRequests()) != 1 {
			t.Fatalf("requests opened: %+v", req.openedRequests())
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
	req := &answerer{state: protocol.RequestApproved, polls: 1}
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
	if r.Kind != protocol.TurnCompleted || out != "selected no" || len(req.openedRequests()) != 0 {
		t.Fatalf("turn %+v %q, %d requests opened; want rejected without asking", r, out, len(req.openedRequests()))
	}
}
