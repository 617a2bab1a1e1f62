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

// TestRequestEndsWithItsTurn (issue 33: a new user approved a request
// whose run had ended; the answer reported success and nothing ran): a
// pending request whose asking turn ends before an answer (its one-shot run
// disposed, a continuable child's turn interrupted by its owner) is
// cancelled, by the turn's end, with the reason: it is no longer listed as
// pending, an answer is ALREADY_ANSWERED naming cancelled, and the tool
// never runs.
func TestRequestEndsWithItsTurn(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	prompt := `call write_file {"path":"x.txt","content":"hi"}` + "\nsay done"
	runs := map[string]string{} // a one-shot child's run
	tests := []struct {
		name   string
		start  func(ctx context.Context, root protocol.ParentRef) string // starts the asking child; its id
		end    func(ctx context.Context, root protocol.Authority, child string)
		reason string // the cancellation's reason contains
	}{
		{"a one-shot run disposed", func(ctx context.Context, root protocol.ParentRef) string {
			run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: root, Prompt: protocol.Text(prompt)})
			if err != nil {
				t.Fatal(err)
			}
			runs[run.ChildID] = run.RunID
			return run.ChildID
		}, func(ctx context.Context, root protocol.Authority, child string) {
			if _, err := s.Client.Dispose(ctx, protocol.RunRef{RunID: runs[child], Parent: root.Parent}); err != nil {
				t.Fatal(err)
			}
		}, "ended aborted"},
		{"a continuable turn interrupted by its owner", func(ctx context.Context, root protocol.ParentRef) string {
			r, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root, Label: "asker", Prompt: protocol.Text(prompt)})
			if err != nil {
				t.Fatal(err)
			}
			return r.ChildID
		}, func(ctx context.Context, root protocol.Authority, child string) {
			if r, err := s.Client.Interrupt(ctx, protocol.InterruptRequest{ChildID: child, Authority: root}); err != nil || !r.Interrupted {
				t.Fatalf("interrupt = %+v, %v", r, err)
			}
		}, "ended aborted (parent)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			dir := t.TempDir()
			root := s.Root(dir)
			child := tt.start(ctx, root.Ref())
			req := pendingRequest(t, s)
			if req.SessionID != child {
				t.Fatalf("request %+v, want one of %s", req, child)
			}
			tt.end(ctx, root.Authority(), child)
			waitTurnEnd(t, s, child)
			// Before the fix: listed pending, and the answer was taken.
			if l, err := s.Client.Requests(ctx, protocol.RequestsListRequest{Authority: s.Grant()}); err != nil || len(l.Requests) != 0 {
				t.Fatalf("pending requests after the turn ended: %+v, %v; want none", l, err)
			}
			_, err := s.Client.AnswerRequest(ctx, protocol.RequestAnswerRequest{RequestID: req.ID, Authority: s.Grant(), Answer: protocol.AnswerApprove})
			if protocol.CodeOf(err) != protocol.CodeAlreadyAnswered || !strings.Contains(err.Error(), protocol.RequestCancelled) {
				t.Fatalf("approving after the turn ended = %v, want ALREADY_ANSWERED naming cancelled", err)
			}
			rec, err := s.Client.GetRequest(ctx, protocol.RequestGetRequest{RequestID: req.ID, Authority: s.Grant()})
			if err != nil || rec.State != protocol.RequestCancelled || rec.Answer == nil || rec.Answer.By.Kind != protocol.AnswererEnded ||
				!strings.Contains(rec.Answer.Reason, tt.reason) {
				t.Fatalf("the request = %+v (answer %+v), %v; want cancelled by ended, reason containing %q", rec, rec.Answer, err, tt.reason)
			}
			l, err := s.Client.Requests(ctx, protocol.RequestsListRequest{Authority: s.Grant(), All: true})
			if err != nil || len(l.Requests) == 0 {
				t.Fatalf("requests.list all = %+v, %v", l, err)
			}
			if _, err := os.Stat(filepath.Join(dir, "x.txt")); err == nil {
				t.Fatal("the tool ran")
			}
		})
	}
}

// waitTurnEnd waits for a turn/end in the session's log.
func waitTurnEnd(t *testing.T, s *stack.Stack, id string) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, evs := s.Log(id)
		return slices.ContainsFunc(evs, func(ev protocol.SessionEvent) bool { return ev.Type == protocol.EvTurnEnd })
	}, "a turn/end in %s's log", id)
}
