package coordinator_test

import (
	"strings"
	"testing"

	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestEmptyAllowListHidesEveryTool: a start whose toolFilter is
// {allow: []} gives the child no global tool (docs/protocol.md §3: "given,
// allow: [] hides every global tool"), through the wire and the worker: its
// call of list_dir is an unknown-tool error; the same call without a filter
// runs the tool.
func TestEmptyAllowListHidesEveryTool(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	root := s.Root()
	result := func(filter *protocol.ToolFilter) protocol.ToolResultData {
		t.Helper()
		run, res, err := s.Run(root.Ref(), "spawn", "call list_dir {}\nsay done", protocol.StartOptions{ToolFilter: filter})
		if err != nil || res.StopReason != protocol.StopCompleted {
			t.Fatalf("run with filter %+v: %+v, %v", filter, res, err)
		}
		_, evs := s.Log(run.ChildID)
		for _, ev := range evs {
			var d protocol.ToolResultData
			if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.Name == "list_dir" {
				return d
			}
		}
		t.Fatalf("no list_dir result in the log of %s", run.ChildID)
		return protocol.ToolResultData{}
	}
	if d := result(nil); d.IsError {
		t.Fatalf("without a filter list_dir failed: %s", protocol.PlainText(d.Content))
	}
	d := result(&protocol.ToolFilter{Allow: []string{}})
	if !d.IsError || !strings.Contains(protocol.PlainText(d.Content), `unknown tool "list_dir"`) {
		t.Fatalf("with allow: [] list_dir answered %+v, want an unknown-tool error", d)
	}
}
