package integration

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
)

// recordingModel wraps the scripted model and records the tools each request advertised.
type recordingModel struct {
	model.Model
	mu    sync.Mutex
	tools [][]string
	first []string // per request: the text of its first user message
}

func (r *recordingModel) Stream(ctx context.Context, req model.Request, onText func(string)) (model.Response, error) {
	var names []string
	for _, t := range req.Tools {
		names = append(names, t.Name)
	}
	r.mu.Lock()
	r.tools = append(r.tools, names)
	r.first = append(r.first, firstUserText(req))
	r.mu.Unlock()
	return r.Model.Stream(ctx, req, onText)
}

// firstUserText is the text of a request's first user message (its task).
func firstUserText(req model.Request) string {
	for _, m := range req.Messages {
		if m.Role == model.RoleUser {
			return protocol.PlainText(m.Content)
		}
	}
	return ""
}

func runtimeStack(t *testing.T) (*stack.Stack, *recordingModel) {
	s := stack.New(t)
	s.AddCoordinator()
	rec := &recordingModel{Model: model.NewScripted()}
	s.AddSpawnWorker(func(c *worker.InProcessConfig) {
		c.Models = func() (model.Model, error) { return rec, nil }
	})
	return s, rec
}

func answerSchema() map[string]any {
	return map[string]any{"type": "object", "properties": map[string]any{"answer": map[string]any{"type": "integer"}}, "required": []any{"answer"}}
}

func TestStructuredOutput(t *testing.T) {
	s, _ := runtimeStack(t)
	root := s.Root()
	tests := []struct {
		script string
		stop   protocol.StopReason
		want   any
	}{
		{`json {"answer":42}`, protocol.StopCompleted, map[string]any{"answer": int64(42)}},
		{`json {"answer":"x"}`, protocol.StopError, nil},
		{"say I will not", protocol.StopError, nil},
	}
	for _, tt := range tests {
		t.Run(tt.script, func(t *testing.T) {
			_, res, err := s.Run(root.Ref(), "spawn", tt.script, protocol.StartOptions{OutputSchema: answerSchema()})
			if err != nil {
				t.Fatal(err)
			}
			if res.StopReason != tt.stop {
				t.Fatalf("result = %+v, want %s", res, tt.stop)
			}
			if tt.want != nil {
				got, ok := res.Structured.(map[string]any)
				if !ok || got["answer"] != int64(42) {
					t.Fatalf("structured = %#v", res.Structured)
				}
			} else if res.Structured != nil {
				t.Fatalf("structured present on a failed run: %#v", res.Structured)
			}
		})
	}
	_, _, err := s.Run(root.Ref(), "spawn", "say x", protocol.StartOptions{OutputSchema: map[string]any{"type": []any{"object"}, "bogus": true}})
	if protocol.CodeOf(err) != protocol.CodeUnsupportedSchema || !strings.Contains(err.Error(), "bogus") || !strings.Contains(err.Error(), "type") {
		t.Fatalf("bad schema = %v", err)
	}
}

func TestNestedDelegationThroughTheSubagentTool(t *testing.T) {
	s, _ := runtimeStack(t)
	root := s.Root()
	run, res, err := s.Run(root.Ref(), "spawn", "call subagent {\"description\":\"d\",\"prompt\":\"say deep\"}\nsay top done", protocol.StartOptions{})
	if err != nil || res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != "top done" {
		t.Fatalf("result = %+v, %v", res, err)
	}
	_, evs := s.Log(run.ChildID)
	var result protocol.ToolResultData
	for _, ev := range evs {
		if ev.Type == protocol.EvToolResult {
			_ = ev.Decode(&result)
		}
	}
	if result.Name != "subagent" || result.IsError || protocol.PlainText(result.Content) != "deep" || result.Meta["childId"] == "" {
		t.Fatalf("subagent result = %+v", result)
	}
	h, gevs := s.Log(result.Meta["childId"])
	if h.DelegationDepth != 2 || h.ParentSession != run.ChildID {
		t.Fatalf("grandchild header = %+v", h)
	}
	if len(gevs) == 0 || gevs[len(gevs)-1].Type != protocol.EvTurnEnd {
		t.Fatal("grandchild log incomplete")
	}
}

func TestDepthLimitNarrowsDownTheTree(t *testing.T) {
	s, rec := runtimeStack(t)
	root := s.Root()
	// The child is capped at depth 2: its own child (depth 2) may delegate no
	// further, even though the subagent tool asks for the default cap of 3,
	// so it is not offered the subagent tool at all (issue 14, item 4), and
	// a call to it anyway is refused as unknown, starting nothing.
	inner := `call subagent {"description":"e","prompt":"say too deep"}`
	script := "call subagent {\"description\":\"d\",\"prompt\":" + strconv.Quote(inner) + "}\nsay done"
	run, res, err := s.Run(root.Ref(), "spawn", script, protocol.StartOptions{MaxDepth: int64(2)})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("result = %+v, %v", res, err)
	}
	_, evs := s.Log(run.ChildID)
	grandchild := ""
	for _, ev := range evs {
		var d protocol.ToolResultData
		if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil {
			grandchild = d.Meta["childId"]
		}
	}
	h, gevs := s.Log(grandchild)
	if h.DepthCap == nil || *h.DepthCap != 2 || h.DelegationDepth != 2 {
		t.Fatalf("grandchild depth %d, depthCap %v", h.DelegationDepth, h.DepthCap)
	}
	var refused protocol.ToolResultData
	for _, ev := range gevs {
		if ev.Type == protocol.EvToolResult {
			_ = ev.Decode(&refused)
		}
	}
	if !refused.IsError || !strings.Contains(protocol.PlainText(refused.Content), `unknown tool "subagent"`) || refused.Meta["childId"] != "" {
		t.Fatalf("great-grandchild start = %+v", refused)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	checked := 0
	for i, names := range rec.tools {
		offered := slices.Contains(names, "subagent")
		switch rec.first[i] {
		case inner: // the grandchild, at its cap
			checked++
			if offered {
				t.Fatalf("the grandchild at its depth cap was offered subagent: %v", names)
			}
		case script: // the child, below its cap
			checked++
			if !offered {
				t.Fatalf("the child below its cap was not offered subagent: %v", names)
			}
		}
	}
	if checked < 3 {
		t.Fatalf("%d requests of the child and grandchild recorded", checked)
	}
}

func TestDeniedToolIsInvisibleAndRefused(t *testing.T) {
	s, rec := runtimeStack(t)
	root := s.Root()
	run, res, err := s.Run(root.Ref(), "spawn", "call list_dir {}\nsay after", protocol.StartOptions{ToolFilter: &protocol.ToolFilter{Deny: []string{"list_dir"}}})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("result = %+v, %v", res, err)
	}
	rec.mu.Lock()
	for _, names := range rec.tools {
		for _, n := range names {
			if n == "list_dir" {
				t.Fatalf("the denied tool was advertised: %v", names)
			}
		}
	}
	rec.mu.Unlock()
	_, evs := s.Log(run.ChildID)
	var d protocol.ToolResultData
	for _, ev := range evs {
		if ev.Type == protocol.EvToolResult {
			_ = ev.Decode(&d)
		}
	}
	if !d.IsError || !strings.Contains(protocol.PlainText(d.Content), `unknown tool "list_dir"`) {
		t.Fatalf("denied call result = %+v", d)
	}
}

func TestToolCeilingIsInherited(t *testing.T) {
	s, rec := runtimeStack(t)
	root := s.Root()
	// The child may not read files; neither may anything it starts.
	_, res, err := s.Run(root.Ref(), "spawn", "call subagent {\"description\":\"d\",\"prompt\":\"say hi\"}\nsay done",
		protocol.StartOptions{ToolFilter: &protocol.ToolFilter{Deny: []string{"read_file"}}})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("result = %+v, %v", res, err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.tools) < 3 {
		t.Fatalf("%d model requests recorded", len(rec.tools))
	}
	for _, names := range rec.tools {
		for _, n := range names {
			if n == "read_file" {
				t.Fatalf("read_file advertised below a parent that was denied it: %v", names)
			}
		}
	}
}
