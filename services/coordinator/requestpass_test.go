package coordinator_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestPassRequestUp (issue 33, item 4: "a parent may also pass it up"): an
// agent told of a request passes it up with answer_request pass_up
// (scripted); the next ancestor above it that takes requests becomes its
// handler and is told, with who passed it, and its answer runs the call
// once; with none above, the request waits on the user. Passing again
// changes nothing; a user's pass_up is INVALID_ARGUMENT, a stranger's
// UNAUTHORIZED, and one after the answer ALREADY_ANSWERED.
func TestPassRequestUp(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	const write = `call write_file {"path":"x.txt","content":"hi"}` + "\nsay done"
	on := func(decision string) string {
		return `on /request (r[0-9a-f]{24})/ call answer_request {"requestId":"$1","decision":"` + decision + `"}`
	}
	// mid passes up the request of its background child (the asking leaf).
	mid := func(t *testing.T) string { return on("pass_up") + "\n" + background(t, write) + "\nsay started" }
	passResult := func(t *testing.T, id string) string {
		var res []protocol.ToolResultData
		testutil.Eventually(t, 60*time.Second, func() bool {
			_, evs := s.Log(id)
			res = toolResults(evs, protocol.ToolAnswerRequest)
			return len(res) > 0
		}, "the agent passes the request up")
		if len(res) != 1 || res[0].IsError {
			t.Fatalf("answer_request results %+v, want one passing it up", res)
		}
		return protocol.PlainText(res[0].Content)
	}
	leafOf := func(t *testing.T, ctx context.Context, under string) protocol.RequestRecord {
		var req protocol.RequestRecord
		testutil.Eventually(t, 60*time.Second, func() bool {
			l, err := s.Client.Requests(ctx, protocol.RequestsListRequest{Authority: s.Grant(), Under: under, All: true})
			if err != nil || len(l.Requests) != 1 {
				return false
			}
			req = l.Requests[0]
			return len(req.PassedBy) > 0 || req.State != protocol.RequestPending
		}, "the request is opened and passed up")
		return req
	}
	written := func(t *testing.T, req protocol.RequestRecord, dir string, by protocol.Answerer) {
		var evs []protocol.SessionEvent
		testutil.Eventually(t, 60*time.Second, func() bool {
			_, evs = s.Log(req.SessionID)
			return len(toolResults(evs, "write_file")) > 0 && evs[len(evs)-1].Type == protocol.EvTurnEnd
		}, "the asking call ends")
		if res := toolResults(evs, "write_file"); len(res) != 1 || res[0].IsError {
			t.Fatalf("write_file results %+v, want one that ran", res)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "x.txt")); err != nil || string(b) != "hi" {
			t.Fatalf("x.txt: %q, %v", b, err)
		}
		for _, ev := range evs {
			var d protocol.RequestAnswerData
			if ev.Type == protocol.EvRequestAnswer && ev.Decode(&d) == nil && (d.By.Kind != by.Kind || d.By.SessionID != by.SessionID) {
				t.Fatalf("answered by %+v, want %+v", d.By, by)
			}
		}
	}

	t.Run("to the agent above, which approves", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		dir := t.TempDir()
		lead, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: s.Root(dir).Ref(), Label: "lead",
			Prompt: protocol.Text(on("approve") + "\n" + background(t, mid(t)) + "\nsay started")})
		if err != nil {
			t.Fatal(err)
		}
		req := leafOf(t, ctx, lead.ChildID)
		_, levs := s.Log(lead.ChildID)
		midID := ""
		for _, r := range toolResults(levs, "subagent") {
			midID = r.Meta["childId"]
		}
		if midID == "" || len(req.PassedBy) != 1 || req.PassedBy[0] != midID {
			t.Fatalf("the request %+v, want passed by mid %s", req, midID)
		}
		if text := passResult(t, midID); !strings.Contains(text, "passed up") || !strings.Contains(text, "waits on agent "+lead.ChildID) {
			t.Fatalf("mid's answer_request result %q, want passed up to lead %s", text, lead.ChildID)
		}
		written(t, req, dir, protocol.Answerer{Kind: protocol.AnswererAgent, SessionID: lead.ChildID})
		rec, err := s.Client.GetRequest(ctx, protocol.RequestGetRequest{RequestID: req.ID, Authority: s.Grant()})
		if err != nil || rec.Handler != lead.ChildID || !slices.Equal(rec.PassedBy, []string{midID}) || rec.State != protocol.RequestApproved {
			t.Fatalf("the request %+v, %v; want approved, handler lead %s, passed by mid %s", rec, err, lead.ChildID, midID)
		}
		_, midEvs := s.Log(midID)
		_, leadEvs := s.Log(lead.ChildID)
		mn, ln := requestNotices(midEvs), requestNotices(leadEvs)
		if len(mn) != 1 || !strings.Contains(protocol.PlainText(mn[0].Content), `"decision":"pass_up"`) {
			t.Fatalf("mid's notices %+v, want one saying how to pass it up", mn)
		}
		if len(ln) != 1 || !strings.Contains(protocol.PlainText(ln[0].Content), "Passed up to you by agent "+midID) || !strings.Contains(protocol.PlainText(ln[0].Content), req.ID) {
			t.Fatalf("lead's notices %+v, want one passed up by mid %s", ln, midID)
		}
	})

	t.Run("to the user, when none above takes requests", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		dir := t.TempDir()
		root, stranger := s.Root(dir), s.Root()
		m, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "mid", Prompt: protocol.Text(mid(t))})
		if err != nil {
			t.Fatal(err)
		}
		req := leafOf(t, ctx, m.ChildID)
		if text := passResult(t, m.ChildID); !strings.Contains(text, "waits on the user") {
			t.Fatalf("mid's answer_request result %q, want passed up to the user", text)
		}
		if req.Handler != "" || !slices.Equal(req.PassedBy, []string{m.ChildID}) || req.State != protocol.RequestPending {
			t.Fatalf("the request %+v, want pending on the user, passed by %s", req, m.ChildID)
		}
		pass := func(auth protocol.Authority) (protocol.RequestRecord, error) {
			return s.Client.AnswerRequest(ctx, protocol.RequestAnswerRequest{RequestID: req.ID, Authority: auth, Answer: protocol.AnswerPassUp})
		}
		if _, err := pass(stranger.Authority()); protocol.CodeOf(err) != protocol.CodeUnauthorized {
			t.Fatalf("a stranger's pass_up = %v, want UNAUTHORIZED", err)
		}
		if _, err := pass(s.Grant()); protocol.CodeOf(err) != protocol.CodeInvalidArgument {
			t.Fatalf("the user's pass_up = %v, want INVALID_ARGUMENT", err)
		}
		// The root (an ancestor with a credential) passes it too, once.
		for range 2 {
			got, err := pass(root.Authority())
			if err != nil || got.State != protocol.RequestPending || got.Handler != "" || !slices.Equal(got.PassedBy, []string{m.ChildID, root.Ref().SessionID}) {
				t.Fatalf("the root's pass_up = %+v, %v; want passed by mid then the root, pending on the user", got, err)
			}
		}
		if _, err := s.Client.AnswerRequest(ctx, protocol.RequestAnswerRequest{RequestID: req.ID, Authority: s.Grant(), Answer: protocol.AnswerApprove}); err != nil {
			t.Fatal(err)
		}
		written(t, req, dir, protocol.Answerer{Kind: protocol.AnswererUser})
		if _, err := pass(root.Authority()); protocol.CodeOf(err) != protocol.CodeAlreadyAnswered {
			t.Fatalf("pass_up after the answer = %v, want ALREADY_ANSWERED", err)
		}
	})
}
