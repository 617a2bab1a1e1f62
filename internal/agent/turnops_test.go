package agent

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// coordinatorLag is how long the test's coordinator takes to answer a
// request once the turn that sent it was cancelled: the request is carried
// out, its answer comes after its caller's turn ended.
const coordinatorLag = 200 * time.Millisecond

// TestATurnsCancellationDoesNotHideWhatItsOperationsDid (issue 37, item 7):
// an operation an agent starts on its turn's behalf whose request the
// turn's own cancellation reaches while the coordinator carries it out is
// reported as the coordinator carried it out: a background start as the
// child started (its id), a message as queued (its id), a foreground
// child's dispose whose answer was UNAVAILABLE as the run ended (read back
// with runs.await). Before, the first two were cut with the turn and
// reported "could not be started" / "was not delivered: CANCELLED" for a
// child that runs and a message that is queued, and the third "disposing
// it failed".
func TestATurnsCancellationDoesNotHideWhatItsOperationsDid(t *testing.T) {
	s := testutil.Server(t)
	cl, err := client.New(testutil.Connect(t, s.ClientURL()), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	srv := rpc.NewServer(testutil.Connect(t, s.ClientURL()), 8, testutil.Logger(t))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Stop(ctx)
	})
	subj := cl.Subjects()
	var mu sync.Mutex
	var cancelTurn context.CancelCauseFunc
	cut := func() {
		mu.Lock()
		defer mu.Unlock()
		cancelTurn(&Cancel{Cause: protocol.CauseParent})
	}
	var started, queued []string
	handle := func(ep string, h rpc.Handler) {
		if err := srv.Handle(subj.Coord(ep), h); err != nil {
			t.Fatal(err)
		}
	}
	handle(protocol.EpContinuableStart, rpc.Typed(func(_ context.Context, _ rpc.Request, r protocol.ContinuableStartRequest) (protocol.ContinuableStartReply, error) {
		cut()
		time.Sleep(coordinatorLag)
		mu.Lock()
		started = append(started, r.ChildID)
		mu.Unlock()
		return protocol.ContinuableStartReply{ChildID: r.ChildID, MessageID: "first-prompt"}, nil
	}))
	handle(protocol.EpContinuableFollowup, rpc.Typed(func(_ context.Context, _ rpc.Request, r protocol.FollowupRequest) (protocol.FollowupReply, error) {
		cut()
		time.Sleep(coordinatorLag)
		mu.Lock()
		queued = append(queued, r.IdempotencyKey)
		mu.Unlock()
		return protocol.FollowupReply{MessageID: "message-" + r.IdempotencyKey}, nil
	}))
	handle(protocol.EpRunsStart, rpc.Typed(func(_ context.Context, _ rpc.Request, r protocol.RunStartRequest) (protocol.RunStartReply, error) {
		defer cut() // the turn is cancelled while the child runs
		return protocol.RunStartReply{RunID: "run-1", ChildID: "foreground-child"}, nil
	}))
	handle(protocol.EpRunsDispose, rpc.Typed(func(context.Context, rpc.Request, protocol.RunRef) (protocol.RunStatus, error) {
		return protocol.RunStatus{}, protocol.Errorf(protocol.CodeUnavailable, "the child's host did not answer the dispose in time")
	}))
	handle(protocol.EpRunsAwait, rpc.Typed(func(_ context.Context, _ rpc.Request, r protocol.RunRef) (protocol.RunStatus, error) {
		return protocol.RunStatus{RunID: r.RunID, ChildID: "foreground-child", State: protocol.RunSettled, Result: &protocol.SubagentResult{
			StopReason: protocol.StopAborted, Output: protocol.Text("half done")}}, nil
	}))

	tc := ToolContext{Header: protocol.SessionHeader{ID: "parent-1", DelegationDepth: 1}, Credential: "cred"}
	for _, c := range []struct {
		name, args string
		tool       *Tool
		want       func(ToolResult) string // "" when right
	}{
		{"a background start", `{"description":"bg","prompt":"work","run_in_background":true}`,
			SubagentTool(SubagentConfig{Client: cl, Provider: "spawn", Background: BackgroundStarter(cl, "spawn")}),
			func(r ToolResult) string {
				mu.Lock()
				defer mu.Unlock()
				if r.IsError || len(started) != 1 || r.Meta["childId"] != started[0] || !strings.Contains(protocol.PlainText(r.Content), "started subagent "+started[0]) {
					return "want the child the coordinator started, " + strings.Join(started, ",")
				}
				return ""
			}},
		{"a message", `{"subagent_id":"child-7","message":"more"}`, SendMessageTool(cl),
			func(r ToolResult) string {
				mu.Lock()
				defer mu.Unlock()
				if r.IsError || len(queued) != 1 || r.Meta["messageId"] != "message-"+queued[0] {
					return "want the message the coordinator queued, " + strings.Join(queued, ",")
				}
				return ""
			}},
		{"a foreground child's dispose", `{"description":"fg","prompt":"work"}`,
			SubagentTool(SubagentConfig{Client: cl, Provider: "spawn"}),
			func(r ToolResult) string {
				text := protocol.PlainText(r.Content)
				if !strings.Contains(text, "The subagent was cancelled before it finished") || !strings.Contains(text, "half done") || r.Meta["runId"] != "run-1" {
					return "want the run's end as runs.await reads it (aborted, its partial output)"
				}
				return ""
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			mu.Lock()
			cancelTurn = cancel
			mu.Unlock()
			r := c.tool.Run(ctx, tc, c.args)
			if ctx.Err() == nil {
				t.Fatal("the turn was not cancelled during the operation")
			}
			if why := c.want(r); why != "" {
				t.Fatalf("%s reported %q (isError %v, meta %v); %s", c.name, protocol.PlainText(r.Content), r.IsError, r.Meta, why)
			}
		})
	}
}
