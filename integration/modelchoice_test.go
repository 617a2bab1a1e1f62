package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
	spawnworker "github.com/brood-dev/brood/services/spawn-worker"
)

// Issue 37, item 3: a start chooses among the models a worker offers (its
// `model` option, checked at admission against the descriptor; a child
// inherits its parent's choice), and the turn limits are worker settings a
// start may only tighten (docs/protocol.md §5.5, "Model and turn limits").

var (
	small = protocol.ModelInfo{Adapter: "scripted", ID: "small"}
	large = protocol.ModelInfo{Adapter: "scripted", ID: "large"}
)

// twoModelStack is a stack whose spawn worker offers two scripted models,
// small (the default) and large, as `brood spawn-worker --model scripted
// --model-name small,large` does; and a provider "bare" whose descriptor
// names neither models nor limits (a worker built as a library that does
// not say).
func twoModelStack(t *testing.T) *stack.Stack {
	s := stack.New(t)
	s.AddCoordinator()
	desc := spawnworker.Descriptor(spawnworker.DefaultName)
	desc.Models = []protocol.ModelInfo{small, large}
	s.AddInProcessWorker(desc, func(c *worker.InProcessConfig) {
		c.Models = func() (model.Model, error) { return model.NewScriptedID(small.ID), nil }
		c.ModelFor = func(m protocol.ModelInfo) (model.Model, error) { return model.NewScriptedID(m.ID), nil }
	})
	s.AddHost(&worker.InProcess{
		Desc:   protocol.ProviderDescriptor{Name: "bare", Tools: []string{}},
		Models: func() (model.Model, error) { return model.NewScripted(), nil },
		Tools:  func(worker.SessionSpec) ([]*agent.Tool, error) { return nil, nil },
	})
	return s
}

// stepModels returns the model each step/start of a session's log names.
func stepModels(t *testing.T, evs []protocol.SessionEvent) []string {
	t.Helper()
	var out []string
	for _, ev := range evs {
		if ev.Type != protocol.EvStepStart {
			continue
		}
		var d protocol.StepData
		if err := ev.Decode(&d); err != nil {
			t.Fatal(err)
		}
		out = append(out, d.Model)
	}
	return out
}

// childOf returns the one child the lifecycle events under parent name.
func childOf(t *testing.T, s *stack.Stack, parent string) string {
	t.Helper()
	for _, ev := range s.Lifecycle(parent) {
		if ev.Type == protocol.LifecycleStart {
			return ev.ID
		}
	}
	t.Fatalf("session %s started no child", parent)
	return ""
}

// toolErrors returns the text of the error results of a session's tool calls.
func toolErrors(t *testing.T, evs []protocol.SessionEvent) []string {
	t.Helper()
	var out []string
	for _, ev := range evs {
		if ev.Type != protocol.EvToolResult {
			continue
		}
		var d protocol.ToolResultData
		if err := ev.Decode(&d); err != nil {
			t.Fatal(err)
		}
		if d.IsError {
			out = append(out, protocol.PlainText(d.Content))
		}
	}
	return out
}

func TestAStartChoosesItsModel(t *testing.T) {
	s := twoModelStack(t)
	root := s.Root()
	tests := []struct {
		name       string
		provider   string
		model      string
		prompt     string
		wantCode   protocol.Code
		wantHeader *protocol.ModelInfo
		wantSteps  string // the model of the run's steps
		// the child the run's subagent call started: its header's model and its steps'
		wantChild      *protocol.ModelInfo
		wantChildSteps string
	}{
		{name: "no model: the provider's default", prompt: "say hi", wantSteps: "scripted/small"},
		{name: "an id the worker offers", model: "large", prompt: "say hi", wantHeader: &large, wantSteps: "scripted/large"},
		{name: "adapter/id", model: "scripted/large", prompt: "say hi", wantHeader: &large, wantSteps: "scripted/large"},
		{name: "the default named", model: "small", prompt: "say hi", wantHeader: &small, wantSteps: "scripted/small"},
		{name: "a model the worker does not offer", model: "huge", prompt: "say hi", wantCode: protocol.CodeInvalidArgument},
		{name: "an adapter the worker does not run", model: "openai/large", prompt: "say hi", wantCode: protocol.CodeInvalidArgument},
		{name: "a provider that names no models", provider: "bare", model: "small", prompt: "say hi", wantCode: protocol.CodeUnsupportedCapability},
		{name: "a child inherits its parent's choice", model: "large",
			prompt:     "call subagent {\"description\":\"inherit\",\"prompt\":\"say hi\"}\nsay done",
			wantHeader: &large, wantSteps: "scripted/large", wantChild: &large, wantChildSteps: "scripted/large"},
		{name: "a child names another model", model: "large",
			prompt:     "call subagent {\"description\":\"other\",\"prompt\":\"say hi\",\"model\":\"small\"}\nsay done",
			wantHeader: &large, wantSteps: "scripted/large", wantChild: &small, wantChildSteps: "scripted/small"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			provider := tc.provider
			if provider == "" {
				provider = spawnworker.DefaultName
			}
			before := s.SessionCount()
			run, res, err := s.Run(root.Ref(), provider, tc.prompt, protocol.StartOptions{Model: tc.model})
			if tc.wantCode != "" {
				if protocol.CodeOf(err) != tc.wantCode {
					t.Fatalf("start: %v, want %s", err, tc.wantCode)
				}
				if n := s.SessionCount(); n != before {
					t.Fatalf("a refused start wrote %d session headers", n-before)
				}
				return
			}
			if err != nil || res.StopReason != protocol.StopCompleted {
				t.Fatalf("run: %+v, %v", res, err)
			}
			h, evs := s.Log(run.ChildID)
			if !equalModel(h.Model, tc.wantHeader) {
				t.Fatalf("header model %v, want %v", h.Model, tc.wantHeader)
			}
			for _, m := range stepModels(t, evs) {
				if m != tc.wantSteps {
					t.Fatalf("steps answered by %q, want %q", stepModels(t, evs), tc.wantSteps)
				}
			}
			if tc.wantChild == nil {
				return
			}
			ch, cevs := s.Log(childOf(t, s, run.ChildID))
			if !equalModel(ch.Model, tc.wantChild) {
				t.Fatalf("child's header model %v, want %v", ch.Model, tc.wantChild)
			}
			if got := stepModels(t, cevs); len(got) != 1 || got[0] != tc.wantChildSteps {
				t.Fatalf("child's steps answered by %q, want %q", got, tc.wantChildSteps)
			}
		})
	}
	t.Run("continuable.start", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		r, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: spawnworker.DefaultName, Parent: root.Ref(),
			Label: "bg", Prompt: protocol.Text("say hi"), Options: protocol.ContinuableOptions{Model: "large"}})
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 30*time.Second, func() bool {
			_, evs := s.Log(r.ChildID)
			m := stepModels(t, evs)
			return len(m) == 1 && m[0] == "scripted/large"
		}, "the continuable child's first turn answered by scripted/large")
		_, err = s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: spawnworker.DefaultName, Parent: root.Ref(),
			Label: "bg", Prompt: protocol.Text("say hi"), Options: protocol.ContinuableOptions{Model: "huge"}})
		if protocol.CodeOf(err) != protocol.CodeInvalidArgument {
			t.Fatalf("continuable.start on a model not offered: %v, want INVALID_ARGUMENT", err)
		}
	})
}

func equalModel(a, b *protocol.ModelInfo) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func TestTurnLimitsOnlyTighten(t *testing.T) {
	s := twoModelStack(t)
	// A worker set to 3 steps per turn (brood spawn-worker
	// --steps-per-turn-max 3) shows it in its descriptor.
	tight := spawnworker.Descriptor("tight")
	tight.Models = []protocol.ModelInfo{model.ScriptedInfo}
	s.AddInProcessWorker(tight, func(c *worker.InProcessConfig) { c.Limits.StepsPerTurnMax = 3 })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	listed, err := s.Client.Providers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]*protocol.TurnLimits{}
	for _, d := range listed.Providers {
		shown[d.Name] = d.Limits
	}
	if l := shown["spawn"]; l == nil || *l != protocol.DefaultTurnLimits() {
		t.Fatalf("spawn's descriptor limits %+v, want the defaults %+v", l, protocol.DefaultTurnLimits())
	}
	if l := shown["tight"]; l == nil || l.StepsPerTurnMax != 3 || l.TurnTimeoutMs != protocol.DefaultTurnTimeoutMs || l.ToolCallsPerStepMax != protocol.DefaultToolCallsPerStepMax {
		t.Fatalf("tight's descriptor limits %+v, want 3 steps and the other defaults", l)
	}
	if shown["bare"] != nil {
		t.Fatalf("bare's descriptor limits %+v, want none", shown["bare"])
	}

	// Consecutive calls are one answer; a sleep between them makes each
	// its own step (the scripted model's grouping).
	const threeSteps = "call list_dir {}\nsleep 0s\ncall list_dir {}\nsay done"
	const twoCalls = "call list_dir {}\ncall list_dir {}"
	root := s.Root()
	tests := []struct {
		name     string
		provider string
		limits   *protocol.TurnLimits
		prompt   string
		wantCode protocol.Code // the start's error
		// the run's end: its stop reason, error code and steps
		wantStop    protocol.StopReason
		wantErrCode protocol.Code
		wantSteps   int
		wantHeader  *protocol.TurnLimits
	}{
		{name: "no limits: the worker's", prompt: threeSteps, wantStop: protocol.StopCompleted, wantSteps: 3,
			wantHeader: &protocol.TurnLimits{TurnTimeoutMs: protocol.DefaultTurnTimeoutMs, StepsPerTurnMax: 64, ToolCallsPerStepMax: 32}},
		{name: "stepsPerTurnMax 2 stops the turn at 2 steps", limits: &protocol.TurnLimits{StepsPerTurnMax: 2}, prompt: threeSteps,
			wantStop: protocol.StopError, wantErrCode: protocol.CodeLimitExceeded, wantSteps: 2,
			wantHeader: &protocol.TurnLimits{TurnTimeoutMs: protocol.DefaultTurnTimeoutMs, StepsPerTurnMax: 2, ToolCallsPerStepMax: 32}},
		{name: "toolCallsPerStepMax 1 refuses two calls in one answer", limits: &protocol.TurnLimits{ToolCallsPerStepMax: 1}, prompt: twoCalls,
			wantStop: protocol.StopError, wantErrCode: protocol.CodeLimitExceeded, wantSteps: 1},
		{name: "turnTimeoutMs 300 ends a sleeping turn", limits: &protocol.TurnLimits{TurnTimeoutMs: 300}, prompt: "sleep 30s\nsay late",
			wantStop: protocol.StopError, wantErrCode: protocol.CodeLimitExceeded, wantSteps: 1},
		{name: "the worker's own limit equals it: allowed", limits: &protocol.TurnLimits{StepsPerTurnMax: 64}, prompt: "say hi", wantStop: protocol.StopCompleted, wantSteps: 1},
		{name: "more steps than the worker's", limits: &protocol.TurnLimits{StepsPerTurnMax: 65}, prompt: "say hi", wantCode: protocol.CodeInvalidArgument},
		{name: "a longer turn than the worker's", limits: &protocol.TurnLimits{TurnTimeoutMs: protocol.DefaultTurnTimeoutMs + 1}, prompt: "say hi", wantCode: protocol.CodeInvalidArgument},
		{name: "more than a tighter worker's", provider: "tight", limits: &protocol.TurnLimits{StepsPerTurnMax: 4}, prompt: "say hi", wantCode: protocol.CodeInvalidArgument},
		{name: "a tighter worker's own setting holds", provider: "tight", prompt: "call list_dir {}\nsleep 0s\ncall list_dir {}\nsleep 0s\ncall list_dir {}\nsay done",
			wantStop: protocol.StopError, wantErrCode: protocol.CodeLimitExceeded, wantSteps: 3},
		{name: "a negative limit", limits: &protocol.TurnLimits{ToolCallsPerStepMax: -1}, prompt: "say hi", wantCode: protocol.CodeInvalidArgument},
		{name: "limits of a provider that describes none", provider: "bare", limits: &protocol.TurnLimits{StepsPerTurnMax: 2}, prompt: "say hi", wantCode: protocol.CodeUnsupportedCapability},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			provider := tc.provider
			if provider == "" {
				provider = spawnworker.DefaultName
			}
			before := s.SessionCount()
			run, res, err := s.Run(root.Ref(), provider, tc.prompt, protocol.StartOptions{Limits: tc.limits})
			if tc.wantCode != "" {
				var pe *protocol.Error
				if !errors.As(err, &pe) || pe.Code != tc.wantCode {
					t.Fatalf("start: %v, want %s", err, tc.wantCode)
				}
				if tc.wantCode == protocol.CodeInvalidArgument && pe.Details["limit"] == nil {
					t.Fatalf("the refusal %v does not name the limit", err)
				}
				if n := s.SessionCount(); n != before {
					t.Fatalf("a refused start wrote %d session headers", n-before)
				}
				return
			}
			if err != nil || res.StopReason != tc.wantStop || res.ErrorCode != tc.wantErrCode {
				t.Fatalf("run ended %+v, %v; want %s %s", res, err, tc.wantStop, tc.wantErrCode)
			}
			h, evs := s.Log(run.ChildID)
			if got := len(stepModels(t, evs)); got != tc.wantSteps {
				t.Fatalf("the turn took %d steps, want %d", got, tc.wantSteps)
			}
			if tc.wantHeader != nil && (h.Limits == nil || *h.Limits != *tc.wantHeader) {
				t.Fatalf("header limits %+v, want %+v", h.Limits, tc.wantHeader)
			}
		})
	}

	// A child's limits are at most its parent's: one asking for more is
	// refused (its parent's subagent call answers the refusal), one asking
	// nothing inherits them.
	children := []struct {
		name      string
		call      string
		wantError string // in the parent's tool result
		wantChild int64  // the child's stepsPerTurnMax
	}{
		{name: "asks more than its parent", call: `{"description":"more","prompt":"say hi","limits":{"stepsPerTurnMax":6}}`, wantError: "stepsPerTurnMax 6 is above the 5 steps allowed"},
		{name: "asks nothing: inherits its parent's", call: `{"description":"same","prompt":"say hi"}`, wantChild: 5},
		{name: "asks less", call: `{"description":"less","prompt":"say hi","limits":{"stepsPerTurnMax":4}}`, wantChild: 4},
	}
	for _, tc := range children {
		t.Run("a child "+tc.name, func(t *testing.T) {
			run, res, err := s.Run(root.Ref(), spawnworker.DefaultName, "call subagent "+tc.call+"\nsay done", protocol.StartOptions{Limits: &protocol.TurnLimits{StepsPerTurnMax: 5}})
			if err != nil || res.StopReason != protocol.StopCompleted {
				t.Fatalf("parent: %+v, %v", res, err)
			}
			_, evs := s.Log(run.ChildID)
			errs := toolErrors(t, evs)
			if tc.wantError != "" {
				if len(errs) != 1 || !strings.Contains(errs[0], "INVALID_ARGUMENT") || !strings.Contains(errs[0], tc.wantError) {
					t.Fatalf("the parent's subagent call answered %q, want INVALID_ARGUMENT %q", errs, tc.wantError)
				}
				if ev := s.Lifecycle(run.ChildID); len(ev) != 0 {
					t.Fatalf("a refused child started: %+v", ev)
				}
				return
			}
			if len(errs) != 0 {
				t.Fatalf("the parent's subagent call failed: %q", errs)
			}
			ch, _ := s.Log(childOf(t, s, run.ChildID))
			if ch.Limits == nil || ch.Limits.StepsPerTurnMax != tc.wantChild {
				t.Fatalf("child's limits %+v, want %d steps per turn", ch.Limits, tc.wantChild)
			}
		})
	}

	// agents.open with a lineage (the ACP hop: `brood acp-agent` serving a
	// Brood child's delegation) gives the root its parent's limits, which
	// bind the root's agent and its own children.
	t.Run("a lineage root takes its parent's limits", func(t *testing.T) {
		run, res, err := s.Run(root.Ref(), spawnworker.DefaultName, "say hi", protocol.StartOptions{Limits: &protocol.TurnLimits{StepsPerTurnMax: 5}})
		if err != nil || res.StopReason != protocol.StopCompleted {
			t.Fatalf("parent: %+v, %v", res, err)
		}
		lr, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Lineage: &protocol.RootLineage{ParentSession: run.ChildID, DelegationDepth: 2}})
		if err != nil {
			t.Fatal(err)
		}
		defer lr.Close(ctx)
		if h, _ := s.Log(lr.SessionID); h.Limits == nil || h.Limits.StepsPerTurnMax != 5 {
			t.Fatalf("the lineage root's limits %+v, want its parent's 5 steps per turn", h.Limits)
		}
		_, _, err = s.Run(lr.Ref(), spawnworker.DefaultName, "say hi", protocol.StartOptions{Limits: &protocol.TurnLimits{StepsPerTurnMax: 6}})
		if protocol.CodeOf(err) != protocol.CodeInvalidArgument {
			t.Fatalf("a child of the lineage root asking more: %v, want INVALID_ARGUMENT", err)
		}
	})
}
