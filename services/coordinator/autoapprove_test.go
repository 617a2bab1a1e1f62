package coordinator_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// TestAutoApproveThroughTheTree (issue 33, item 3): through the wire, the
// coordinator and the spawn worker, write_file needs approval (here no one
// answers, so its request times out, a denial) unless the start allowed it
// outright; the tool filter still removes it; a
// grandchild inherits its parent's autoApprove; a name the provider does
// not offer is INVALID_ARGUMENT.
func TestAutoApproveThroughTheTree(t *testing.T) {
	s := stack.New(t)
	// No one answers here: a call that asks times out (a denial) at once.
	s.AddCoordinator(func(c *coordinator.Config) { c.RequestTimeout = time.Second })
	s.AddSpawnWorker()
	write := func(name string) string {
		return `call write_file {"path":"` + name + `","content":"hi"}`
	}
	delegate := func(prompt string) string {
		args, err := json.Marshal(map[string]string{"description": "deeper", "prompt": prompt})
		if err != nil {
			t.Fatal(err)
		}
		return "call subagent " + string(args)
	}
	tests := []struct {
		name    string
		prompt  string
		opts    protocol.StartOptions
		result  string // the write_file result contains
		isError bool
		written bool
		deeper  bool // the write is the grandchild's
	}{
		{"asks by default", write("a.txt") + "\nsay done", protocol.StartOptions{}, "timed out", true, false, false},
		{"allowed outright", write("b.txt") + "\nsay done", protocol.StartOptions{AutoApprove: []string{"write_file"}}, "wrote 2 bytes", false, true, false},
		{"another tool allowed", write("c.txt") + "\nsay done", protocol.StartOptions{AutoApprove: []string{"run_command"}}, "timed out", true, false, false},
		{"the filter still applies", write("d.txt") + "\nsay done",
			protocol.StartOptions{AutoApprove: []string{"write_file"}, ToolFilter: &protocol.ToolFilter{Deny: []string{"write_file"}}}, `unknown tool "write_file"`, true, false, false},
		{"a grandchild inherits", delegate(write("e.txt")+"\nsay ok") + "\nsay done", protocol.StartOptions{AutoApprove: []string{"write_file"}}, "wrote 2 bytes", false, true, true},
		{"a grandchild asks too", delegate(write("f.txt")+"\nsay ok") + "\nsay done", protocol.StartOptions{}, "timed out", true, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			root := s.Root(dir)
			run, res, err := s.Run(root.Ref(), "spawn", tt.prompt, tt.opts)
			if err != nil || res.StopReason != protocol.StopCompleted {
				t.Fatalf("run: %+v, %v", res, err)
			}
			id := run.ChildID
			header, evs := s.Log(id)
			if !slices.Equal(header.AutoApprove, tt.opts.AutoApprove) {
				t.Fatalf("the child's header autoApprove = %v, want %v", header.AutoApprove, tt.opts.AutoApprove)
			}
			if tt.deeper {
				id = ""
				for _, ev := range evs {
					var d protocol.ToolResultData
					if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.Name == "subagent" {
						id = d.Meta["childId"]
					}
				}
				if id == "" {
					t.Fatal("the child started no grandchild")
				}
				header, evs = s.Log(id)
				if !slices.Equal(header.AutoApprove, tt.opts.AutoApprove) {
					t.Fatalf("the grandchild's header autoApprove = %v, want its parent's %v", header.AutoApprove, tt.opts.AutoApprove)
				}
			}
			var got *protocol.ToolResultData
			for _, ev := range evs {
				var d protocol.ToolResultData
				if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.Name == "write_file" {
					got = &d
				}
			}
			if got == nil || got.IsError != tt.isError || !strings.Contains(protocol.PlainText(got.Content), tt.result) {
				t.Fatalf("write_file result in %s = %+v, want error %v containing %q", id, got, tt.isError, tt.result)
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			if written := len(entries) > 0; written != tt.written {
				t.Fatalf("files in the workspace: %v, want written %v", entries, tt.written)
			}
			if tt.written {
				if data, err := os.ReadFile(filepath.Join(dir, entries[0].Name())); err != nil || string(data) != "hi" {
					t.Fatalf("written %q, %v", data, err)
				}
			}
		})
	}
	t.Run("an unknown tool is refused", func(t *testing.T) {
		_, _, err := s.Run(s.Root().Ref(), "spawn", "say hi", protocol.StartOptions{AutoApprove: []string{"rm_rf"}})
		if protocol.CodeOf(err) != protocol.CodeInvalidArgument || !strings.Contains(err.Error(), "rm_rf") {
			t.Fatalf("start with autoApprove [rm_rf] = %v, want INVALID_ARGUMENT naming it", err)
		}
	})
}
