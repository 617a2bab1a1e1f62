package integration

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// parentHistory writes turns into a root's log, as a root that talks to a
// model (an ACP editor session) has: each completed turn is a user message and
// an answer; inFlight adds a turn that called a tool and is still waiting.
func parentHistory(t *testing.T, s *stack.Stack, root *client.Root, completed int, inFlight bool) []protocol.SessionEvent {
	t.Helper()
	evs := testutil.TurnHistory(t, completed, inFlight)
	written, err := s.Store.NewLogWriter(protocol.ScopeRoot, root.SessionID, 0, 0).Append(context.Background(), evs...)
	if err != nil {
		t.Fatal(err)
	}
	return written
}

func firstOwnTurn(t *testing.T, evs []protocol.SessionEvent, from int) int64 {
	t.Helper()
	for _, ev := range evs[from:] {
		if ev.Type == protocol.EvTurnStart {
			var d protocol.TurnData
			_ = ev.Decode(&d)
			return d.Turn
		}
	}
	t.Fatal("the child has no turn of its own")
	return 0
}

func TestForkSeedsTheBalancedCompletedPrefix(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	rec := &recordingModel{Model: model.NewScripted()}
	var firstRequest []model.Message
	s.AddForkWorker(func(c *worker.InProcessConfig) {
		c.Models = func() (model.Model, error) {
			return modelFunc(func(ctx context.Context, req model.Request, onText func(string)) (model.Response, error) {
				if firstRequest == nil {
					firstRequest = req.Messages
				}
				return rec.Stream(ctx, req, onText)
			}), nil
		}
	})
	tests := []struct {
		name      string
		completed int
		inFlight  bool
		seed      int64
		firstTurn int64
	}{
		{"two completed turns", 2, false, 12, 3},
		{"one completed, one in flight", 1, true, 6, 2},
		{"no completed turn", 0, true, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			firstRequest = nil
			root := s.Root()
			parent := parentHistory(t, s, root, tt.completed, tt.inFlight)
			run, res, err := s.Run(root.Ref(), "fork", "say forked", protocol.StartOptions{})
			if err != nil || res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != "forked" {
				t.Fatalf("result = %+v, %v", res, err)
			}
			h, evs := s.Log(run.ChildID)
			if h.SeedLength != tt.seed {
				t.Fatalf("seedLength = %d, want %d", h.SeedLength, tt.seed)
			}
			for i := int64(0); i < tt.seed; i++ {
				if evs[i].Type != parent[i].Type || !bytes.Equal(evs[i].Data, parent[i].Data) || evs[i].Seq != parent[i].Seq {
					t.Fatalf("seed event %d differs from the parent's", i)
				}
			}
			own := int(tt.seed)
			if tt.seed > 0 {
				if evs[tt.seed].Type != protocol.EvSessionEndSeed {
					t.Fatalf("event %d is %s, want session/end-seed", tt.seed, evs[tt.seed].Type)
				}
				own++
			}
			if err := sessionlog.ValidateReplay(evs, false); err != nil {
				t.Fatalf("the child's log does not replay: %v", err)
			}
			if got := firstOwnTurn(t, evs, own); got != tt.firstTurn {
				t.Fatalf("the child's first turn is %d, want %d", got, tt.firstTurn)
			}
			// The first model request ends with the task, framed as following inherited context.
			last := firstRequest[len(firstRequest)-1]
			if last.Role != model.RoleUser || protocol.PlainText(last.Content) != "say forked" {
				t.Fatalf("last message = %+v", last)
			}
			framed := len(last.Content) == 2 && last.Content[0].Framing && last.Content[0].Text == agent.SeedFraming
			if framed != (tt.seed > 0) {
				t.Fatalf("framing present = %v with seed %d: %+v", framed, tt.seed, last.Content)
			}
		})
	}
}

func TestForkChildThatSaysNothingReportsNoOutput(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddForkWorker()
	root := s.Root()
	parentHistory(t, s, root, 2, false)
	_, res, err := s.Run(root.Ref(), "fork", "sleep 1ms", protocol.StartOptions{})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("result = %+v, %v", res, err)
	}
	if len(res.Output) != 0 {
		t.Fatalf("output = %+v; the parent's answer must never leak from the seed", res.Output)
	}
}

func TestForkTakenMidTurnByTheChildsOwnTool(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddForkWorker()
	root := s.Root()
	parentHistory(t, s, root, 1, false)
	// The fork child forks again from inside its own tool call: its grandchild
	// must get only completed turns, never the in-flight one or its open call.
	run, res, err := s.Run(root.Ref(), "fork", "call subagent {\"description\":\"d\",\"prompt\":\"say grand\"}\nsay done", protocol.StartOptions{})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("result = %+v, %v", res, err)
	}
	_, evs := s.Log(run.ChildID)
	var call protocol.ToolResultData
	for _, ev := range evs {
		if ev.Type == protocol.EvToolResult {
			_ = ev.Decode(&call)
		}
	}
	if call.IsError || protocol.PlainText(call.Content) != "grand" {
		t.Fatalf("grandchild result = %+v", call)
	}
	gh, gevs := s.Log(call.Meta["childId"])
	if gh.SeedLength != 6 {
		t.Fatalf("grandchild seedLength = %d, want the 6 events of the one completed turn", gh.SeedLength)
	}
	if err := sessionlog.ValidateReplay(gevs, false); err != nil {
		t.Fatalf("grandchild log does not replay: %v", err)
	}
}

// modelFunc adapts a function to model.Model.
type modelFunc func(ctx context.Context, req model.Request, onText func(string)) (model.Response, error)

func (f modelFunc) Provider() string { return "test" }
func (f modelFunc) Name() string     { return "test" }
func (f modelFunc) Stream(ctx context.Context, req model.Request, onText func(string)) (model.Response, error) {
	return f(ctx, req, onText)
}

// TestBackgroundForkChildIsFramed is issue 14, item 4: a continuable fork
// child (a background subagent, or continuable.start on fork) gets the same
// boundary note before its first task as a one-shot fork child, and only
// there: its later turns are not framed again.
func TestBackgroundForkChildIsFramed(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddForkWorker()
	root := s.Root()
	parentHistory(t, s, root, 2, false)
	start, err := s.Client.StartContinuable(context.Background(), protocol.ContinuableStartRequest{
		Provider: "fork", Parent: root.Ref(), Label: "forked", Prompt: protocol.Text("say forked"),
	})
	if err != nil {
		t.Fatal(err)
	}
	userMessages := func() []protocol.UserMessageData {
		h, evs := s.Log(start.ChildID)
		var out []protocol.UserMessageData
		for _, ev := range evs[h.SeedLength:] {
			var d protocol.UserMessageData
			if ev.Type == protocol.EvUserMessage && ev.Decode(&d) == nil {
				out = append(out, d)
			}
		}
		return out
	}
	testutil.Eventually(t, 10*time.Second, func() bool { _, evs := s.Log(start.ChildID); return turnEnds(evs) == 3 }, "the child's first turn ended")
	p := root.Ref()
	followup(t, s, start.ChildID, protocol.Authority{Parent: &p}, "say again")
	testutil.Eventually(t, 10*time.Second, func() bool { _, evs := s.Log(start.ChildID); return turnEnds(evs) == 4 }, "the child's second turn ended")
	ums := userMessages()
	if len(ums) != 2 {
		t.Fatalf("%d own user messages", len(ums))
	}
	if c := ums[0].Content; len(c) != 2 || !c[0].Framing || c[0].Text != agent.SeedFraming || protocol.PlainText(c) != "say forked" {
		t.Fatalf("first task %+v, want the seed framing before it", c)
	}
	if c := ums[1].Content; len(c) != 1 || c[0].Framing || protocol.PlainText(c) != "say again" {
		t.Fatalf("second turn %+v, want no framing", c)
	}
}
