package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
	acpbridge "github.com/brood-dev/brood/services/acp-bridge"
)

// childRequests lists the requests of session id the grant may see,
// answered ones too.
func childRequests(t *testing.T, s *stack.Stack, id string) []protocol.RequestRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := s.Client.Requests(ctx, protocol.RequestsListRequest{Authority: s.Grant(), All: true})
	if err != nil {
		t.Fatalf("requests.list: %v", err)
	}
	var out []protocol.RequestRecord
	for _, r := range l.Requests {
		if r.SessionID == id {
			out = append(out, r)
		}
	}
	return out
}

// requestTypes renders the request events, permissions and tool events of
// a log in order.
func requestTypes(evs []protocol.SessionEvent) string {
	var out []string
	for _, ev := range evs {
		switch ev.Type {
		case protocol.EvToolCall, protocol.EvToolResult, protocol.EvRequestOpen, protocol.EvRequestAnswer, protocol.EvACPPermission:
			out = append(out, ev.Type)
		}
	}
	return strings.Join(out, " ")
}

// TestACPPermissionAsk (issue 33, item 2c): an ACP agent's permission
// request, under the provider's ask policy, is a request for approval of
// its tool call that the user (a grant) or an ancestor (the root's
// credential) answers with requests.answer: approved, the agent proceeds
// (the fake writes its file, the ACP Go SDK's example agent applies its
// change, and each reports its tool call completed); denied, it gets the
// rejection (its reject option; it writes nothing, says it skips the
// change). A provider with a fixed policy (reject, allow) is answered
// without a request record, as before. The log holds the call, the
// request, its answer and the permission in that order, and the result's
// permissions count the answer.
func TestACPPermissionAsk(t *testing.T) {
	fake := fakeAgent(t)
	example := acpDep(t, goExampleAgent)
	s := stack.New(t)
	s.AddCoordinator()
	o := realAgentOptions(t)
	o.Requests = s.Client
	ps, err := acpbridge.Providers([]acpbridge.AgentConfig{
		{Name: "fake-ask", Command: fake, Permission: acpbridge.PolicyAsk},
		{Name: "fake-reject", Command: fake},
		{Name: "example-ask", Command: example, Permission: acpbridge.PolicyAsk},
		{Name: "example-allow", Command: example, Permission: acpbridge.PolicyAllow},
	}, o)
	if err != nil {
		t.Fatal(err)
	}
	s.AddHost(ps...)
	const (
		exampleArgs = `{"content":"{\"database\": {\"host\": \"new-host\"}}","path":"/home/user/project/config.json"}`
		asked       = "tool/call request/open request/answer acp/permission tool/result"
	)
	tests := []struct {
		name, provider, prompt string
		answer                 string // approve or deny; "" for a fixed policy: no request
		byParent               bool   // the root answers as an ancestor, else the user's grant
		tool, args, callID     string // the request's
		has, lacks             string // the result's output
		written                bool   // the fake wrote x.txt
		tools                  string // the log's tool events
		trail                  string // the request and tool events; "" for a fixed policy (no request events)
		counts                 protocol.PermissionCounts
	}{
		{"fake, approved by the user", "fake-ask", "write x.txt hi", protocol.AnswerApprove, false, "Write x.txt", `{"content":"hi","path":"x.txt"}`, "w1",
			"selected yes", "", true, "call w1 Write x.txt|result w1 ok", asked, protocol.PermissionCounts{Requested: 1, Granted: 1}},
		{"fake, denied by the parent", "fake-ask", "write x.txt hi", protocol.AnswerDeny, true, "Write x.txt", `{"content":"hi","path":"x.txt"}`, "w1",
			"selected no", "", false, "call w1 Write x.txt|result w1 error", asked, protocol.PermissionCounts{Requested: 1, Denied: 1}},
		{"example, approved by the parent", "example-ask", "change the config", protocol.AnswerApprove, true, "Modifying critical configuration file", exampleArgs, "call_2",
			"Perfect! I've successfully updated the configuration.", "skip the configuration update", false,
			"call call_1 Reading project files|result call_1 ok|call call_2 Modifying critical configuration file|result call_2 ok",
			"tool/call tool/result " + asked, protocol.PermissionCounts{Requested: 1, Granted: 1}},
		{"example, denied by the user", "example-ask", "change the config", protocol.AnswerDeny, false, "Modifying critical configuration file", exampleArgs, "call_2",
			"I'll skip the configuration update.", "Perfect!", false,
			"call call_1 Reading project files|result call_1 ok|call call_2 Modifying critical configuration file|result call_2 error",
			"tool/call tool/result " + asked, protocol.PermissionCounts{Requested: 1, Denied: 1}},
		// Unattended providers keep their fixed policy: nobody is asked.
		{"fake, fixed reject", "fake-reject", "write x.txt hi", "", false, "", "", "",
			"selected no", "", false, "call w1 Write x.txt|result w1 error", "", protocol.PermissionCounts{Requested: 1, Denied: 1}},
		{"example, fixed allow", "example-allow", "change the config", "", false, "", "", "",
			"Perfect! I've successfully updated the configuration.", "skip the configuration update", false,
			"call call_1 Reading project files|result call_1 ok|call call_2 Modifying critical configuration file|result call_2 ok",
			"", protocol.PermissionCounts{Requested: 1, Granted: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			dir := t.TempDir()
			root := s.Root(dir)
			run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: tt.provider, Prompt: protocol.Text(tt.prompt), Options: protocol.StartOptions{}})
			if err != nil {
				t.Fatal(err)
			}
			if tt.answer != "" {
				var req protocol.RequestRecord
				testutil.Eventually(t, 30*time.Second, func() bool {
					l := childRequests(t, s, run.ChildID)
					if len(l) > 0 {
						req = l[0]
					}
					return len(l) == 1
				}, "the child's permission request is a pending request")
				if req.Kind != protocol.RequestApproval || req.State != protocol.RequestPending || req.Tool != tt.tool || req.Arguments != tt.args || req.CallID != tt.callID {
					t.Fatalf("request %+v, want %s of %s (%s) pending", req, tt.tool, tt.args, tt.callID)
				}
				if _, err := os.Stat(filepath.Join(dir, "x.txt")); err == nil {
					t.Fatal("the agent wrote before it was allowed")
				}
				auth := s.Grant()
				if tt.byParent {
					auth = root.Authority()
				}
				reason := ""
				if tt.answer == protocol.AnswerDeny {
					reason = "not in this repo"
				}
				if _, err := s.Client.AnswerRequest(ctx, protocol.RequestAnswerRequest{RequestID: req.ID, Authority: auth, Answer: tt.answer, Reason: reason}); err != nil {
					t.Fatalf("answer %s: %v", tt.answer, err)
				}
			}
			res, err := run.Result(ctx)
			if err != nil {
				t.Fatal(err)
			}
			out := protocol.PlainText(res.Output)
			if res.StopReason != protocol.StopCompleted || !strings.Contains(out, tt.has) || tt.lacks != "" && strings.Contains(out, tt.lacks) {
				t.Fatalf("result %s %q (%s), want one with %q", res.StopReason, out, res.Diagnostic, tt.has)
			}
			if res.Permissions == nil || *res.Permissions != tt.counts {
				t.Fatalf("result permissions %+v, want %+v", res.Permissions, tt.counts)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "x.txt")); (err == nil) != tt.written || tt.written && string(b) != "hi" {
				t.Fatalf("x.txt %q, %v; want written %v", b, err, tt.written)
			}
			_, evs := s.Log(run.ChildID)
			if got := strings.Join(toolEvents(t, evs), "|"); got != tt.tools {
				t.Fatalf("tool events %s\nwant %s", got, tt.tools)
			}
			// Under a fixed policy the permission may be logged before the
			// call it names: the SDK answers a request on its own goroutine,
			// beside the queue of the agent's updates. Asked, the call is
			// logged first, from the permission request if need be.
			if got := requestTypes(evs); tt.trail != "" && got != tt.trail || tt.trail == "" && (strings.Contains(got, "request/") || strings.Count(got, protocol.EvACPPermission) != 1) {
				t.Fatalf("log %s\nwant %s", got, tt.trail)
			}
			reqs := childRequests(t, s, run.ChildID)
			if tt.answer == "" {
				if len(reqs) != 0 {
					t.Fatalf("a fixed policy opened requests: %+v", reqs)
				}
				return
			}
			want := map[string]string{protocol.AnswerApprove: protocol.RequestApproved, protocol.AnswerDeny: protocol.RequestDenied}[tt.answer]
			if len(reqs) != 1 || reqs[0].State != want {
				t.Fatalf("requests %+v, want one %s", reqs, want)
			}
		})
	}
}
