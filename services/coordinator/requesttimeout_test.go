package coordinator_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestRequestTimeoutOfAStart (issue 33, item 5): a start's
// requestTimeoutMs is recorded in the child's header, inherited by its
// own subagents and never widened by them; a request a grandchild opens
// under it has that deadline (not the coordinator's 5-minute default) and
// ends there as a logged timeout, a denial. A root opened with one bounds
// its tree; values out of bounds are refused with typed codes naming the
// field.
func TestRequestTimeoutOfAStart(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator() // the default request timeout: 5 minutes
	s.AddSpawnWorker()
	delegate := func(prompt string, extra map[string]any) string {
		in := map[string]any{"description": "deeper", "prompt": prompt}
		for k, v := range extra {
			in[k] = v
		}
		args, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		return "call subagent " + string(args)
	}
	grandchild := func(evs []protocol.SessionEvent) (string, protocol.ToolResultData) {
		for _, ev := range evs {
			var d protocol.ToolResultData
			if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.Name == "subagent" {
				return d.Meta["childId"], d
			}
		}
		t.Fatal("the child called no subagent")
		return "", protocol.ToolResultData{}
	}

	t.Run("a grandchild's request times out at its start's deadline", func(t *testing.T) {
		start := time.Now()
		run, res, err := s.Run(s.Root().Ref(), "spawn",
			delegate(`call write_file {"path":"x.txt","content":"hi"}`+"\nsay ok", nil)+"\nsay done",
			protocol.StartOptions{RequestTimeoutMs: 1500})
		if err != nil || res.StopReason != protocol.StopCompleted {
			t.Fatalf("run: %+v, %v", res, err)
		}
		if took := time.Since(start); took > time.Minute {
			t.Fatalf("the run took %s: its request did not time out at 1.5 s", took)
		}
		h, evs := s.Log(run.ChildID)
		if h.RequestTimeoutMs != 1500 {
			t.Fatalf("the child's header requestTimeoutMs = %d, want 1500", h.RequestTimeoutMs)
		}
		id, _ := grandchild(evs)
		h, evs = s.Log(id)
		if h.RequestTimeoutMs != 1500 {
			t.Fatalf("the grandchild's header requestTimeoutMs = %d, want its parent's 1500", h.RequestTimeoutMs)
		}
		var open protocol.RequestOpenData
		var ans protocol.RequestAnswerData
		var answerAt int64
		for _, ev := range evs {
			switch ev.Type {
			case protocol.EvRequestOpen:
				_ = ev.Decode(&open)
			case protocol.EvRequestAnswer:
				_ = ev.Decode(&ans)
				answerAt = ev.Time
			}
		}
		trail, result := requestTrail(evs)
		if strings.Join(trail, " ") != "tool/call request/open request/answer tool/result" {
			t.Fatalf("the grandchild's log trail %v", trail)
		}
		if ans.State != protocol.RequestTimedOut || ans.By.Kind != protocol.AnswererTimeout || !strings.Contains(ans.Reason, "1.5s") {
			t.Fatalf("request/answer %+v, want timed-out by the timeout after 1.5s", ans)
		}
		if !result.IsError || !strings.Contains(protocol.PlainText(result.Content), "timed out") {
			t.Fatalf("write_file result (error %v) %q, want a timeout denial", result.IsError, protocol.PlainText(result.Content))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rec, err := s.Client.GetRequest(ctx, protocol.RequestGetRequest{RequestID: open.RequestID, Authority: s.Grant()})
		if err != nil {
			t.Fatal(err)
		}
		if rec.Deadline-rec.CreatedAt != 1500 || open.Deadline != rec.Deadline {
			t.Fatalf("request created %d, deadline %d (logged %d): want 1500 ms later", rec.CreatedAt, rec.Deadline, open.Deadline)
		}
		if answerAt < rec.Deadline {
			t.Fatalf("the timeout was logged at %d, before the deadline %d", answerAt, rec.Deadline)
		}
	})

	t.Run("a subagent may not widen it", func(t *testing.T) {
		run, res, err := s.Run(s.Root().Ref(), "spawn",
			delegate("say ok", map[string]any{"requestTimeoutMs": 3000})+"\nsay done", protocol.StartOptions{RequestTimeoutMs: 1500})
		if err != nil || res.StopReason != protocol.StopCompleted {
			t.Fatalf("run: %+v, %v", res, err)
		}
		_, evs := s.Log(run.ChildID)
		for _, ev := range evs {
			var d protocol.ToolResultData
			if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.Name == "subagent" {
				if text := protocol.PlainText(d.Content); !d.IsError || !strings.Contains(text, "INVALID_ARGUMENT") || !strings.Contains(text, "requestTimeoutMs 3000") {
					t.Fatalf("subagent with requestTimeoutMs 3000 under 1500: (error %v) %q, want INVALID_ARGUMENT naming it", d.IsError, text)
				}
				return
			}
		}
		t.Fatal("the child called no subagent")
	})

	t.Run("a root's bounds its tree", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		root, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), RequestTimeoutMs: 2000})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = root.Close(context.Background()) }()
		run, res, err := s.Run(root.Ref(), "spawn", "say hi", protocol.StartOptions{})
		if err != nil || res.StopReason != protocol.StopCompleted {
			t.Fatalf("run: %+v, %v", res, err)
		}
		if h, _ := s.Log(run.ChildID); h.RequestTimeoutMs != 2000 {
			t.Fatalf("the child's header requestTimeoutMs = %d, want the root's 2000", h.RequestTimeoutMs)
		}
		if _, _, err := s.Run(root.Ref(), "spawn", "say hi", protocol.StartOptions{RequestTimeoutMs: 2001}); protocol.CodeOf(err) != protocol.CodeInvalidArgument {
			t.Fatalf("a start above the root's = %v, want INVALID_ARGUMENT", err)
		}
	})

	bad := []struct {
		name string
		ms   int64
		code protocol.Code
	}{
		{"negative", -5, protocol.CodeInvalidArgument},
		{"above 24 hours", protocol.RequestTimeoutMsMax + 1, protocol.CodeLimitExceeded},
	}
	for _, tt := range bad {
		t.Run("a start "+tt.name, func(t *testing.T) {
			_, _, err := s.Run(s.Root().Ref(), "spawn", "say hi", protocol.StartOptions{RequestTimeoutMs: tt.ms})
			if protocol.CodeOf(err) != tt.code || !strings.Contains(err.Error(), "requestTimeoutMs") || !strings.Contains(err.Error(), "milliseconds") {
				t.Fatalf("start with requestTimeoutMs %d = %v, want %s naming the field and its unit", tt.ms, err, tt.code)
			}
		})
		t.Run("a root "+tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), RequestTimeoutMs: tt.ms})
			if protocol.CodeOf(err) != tt.code || !strings.Contains(err.Error(), "requestTimeoutMs") {
				t.Fatalf("agents.open with requestTimeoutMs %d = %v, want %s naming the field", tt.ms, err, tt.code)
			}
		})
	}
}
