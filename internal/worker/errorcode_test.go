package worker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestAFailedRunSaysWhichClassOfFailure: a run (and a continuable child's
// turn) that ends `error` carries the catalogue code of its class as
// errorCode, so a scheduler tells a model outage (MODEL_ERROR, retryable)
// from a limit (LIMIT_EXCEEDED) and from a task that was not done
// (TASK_FAILED), each stable, without parsing the diagnostic (issue 37,
// item 2). A completed run carries none.
func TestAFailedRunSaysWhichClassOfFailure(t *testing.T) {
	const stepsMax, callsMax = 3, 2
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker(func(c *worker.InProcessConfig) {
		c.Limits = agent.Limits{StepsPerTurnMax: stepsMax, ToolCallsPerStepMax: callsMax}
	})
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	listDir := `call list_dir {"path":"."}`
	schema := map[string]any{"type": "object", "properties": map[string]any{"n": map[string]any{"type": "integer"}}, "required": []any{"n"}}
	tests := []struct {
		name      string
		prompt    string
		opts      protocol.StartOptions
		want      protocol.Code
		retryable bool
	}{
		{"a model failure", "fail boom", protocol.StartOptions{}, protocol.CodeModelError, true},
		{"the step limit", strings.Repeat(listDir+"\nsleep 0s\n", stepsMax+1) + "say done",
			protocol.StartOptions{}, protocol.CodeLimitExceeded, false},
		{"the tool-call limit of a step", strings.Repeat(listDir+"\n", callsMax+1), protocol.StartOptions{}, protocol.CodeLimitExceeded, false},
		{"an outputSchema never satisfied", "say no json", protocol.StartOptions{OutputSchema: schema}, protocol.CodeTaskFailed, false},
		{"a completed run", "say fine", protocol.StartOptions{}, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text(tt.prompt), Options: tt.opts})
			if err != nil {
				t.Fatal(err)
			}
			res, err := r.Result(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if res.ErrorCode != tt.want || res.ErrorCode.Retryable() != tt.retryable {
				t.Fatalf("result %s %q errorCode %q (retryable %v); want errorCode %q (retryable %v)",
					res.StopReason, res.Diagnostic, res.ErrorCode, res.ErrorCode.Retryable(), tt.want, tt.retryable)
			}
			if want := protocol.StopCompleted; tt.want != "" {
				if res.StopReason != protocol.StopError {
					t.Fatalf("stopReason %s, want error", res.StopReason)
				}
			} else if res.StopReason != want {
				t.Fatalf("stopReason %s, want %s", res.StopReason, want)
			}
		})
	}

	t.Run("a continuable turn's model failure", func(t *testing.T) {
		c, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "fails", Prompt: protocol.Text("fail boom")})
		if err != nil {
			t.Fatal(err)
		}
		var got protocol.SessionResultReply
		testutil.Eventually(t, 60*time.Second, func() bool {
			got, err = s.Client.SessionResult(ctx, protocol.SessionResultRequest{SessionID: c.ChildID, Authority: root.Authority()})
			return err == nil && got.Finished
		}, "the continuable child finishes its turn")
		if got.StopReason != protocol.StopError || got.ErrorCode != protocol.CodeModelError {
			t.Fatalf("sessions.result %s %q errorCode %q; want error MODEL_ERROR", got.StopReason, got.Diagnostic, got.ErrorCode)
		}
	})
}
