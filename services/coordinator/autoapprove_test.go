package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
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

// TestApproveToolsThroughTheTree (issue 33, item 2(a)): a start's
// approveTools makes a tool that runs freely (read_file here) ask before
// each call, through the wire, the coordinator and the spawn worker: no one
// answers, its request times out (a denial) and the file is not read;
// approved, it runs. A grandchild inherits the set whoever starts it, and
// a provider's descriptor approveTools binds every start of that provider.
func TestApproveToolsThroughTheTree(t *testing.T) {
	s := stack.New(t)
	// No one answers here unless a case does: a call that asks times out
	// (a denial) after a second.
	s.AddCoordinator(func(c *coordinator.Config) { c.RequestTimeout = time.Second })
	s.AddSpawnWorker()
	guarded := worker.InProcessDescriptor("guarded", false)
	guarded.Models, guarded.ApproveTools = []protocol.ModelInfo{model.ScriptedInfo}, []string{"list_dir"}
	s.Provide("guarded")
	s.AddInProcessWorker(guarded)
	read := `call read_file {"path":"notes.txt"}`
	delegate := func(prompt string) string {
		args, err := json.Marshal(map[string]string{"description": "deeper", "prompt": prompt})
		if err != nil {
			t.Fatal(err)
		}
		return "call subagent " + string(args)
	}
	tests := []struct {
		name     string
		provider string
		prompt   string
		opts     protocol.StartOptions
		tool     string // the call looked at
		approve  bool   // approve the one request
		want     []string
		result   string // its result contains
		isError  bool
		deeper   bool // the call is the grandchild's
	}{
		{"runs freely by default", "spawn", read + "\nsay done", protocol.StartOptions{}, "read_file", false, nil, "secret plans", false, false},
		{"asks when named", "spawn", read + "\nsay done", protocol.StartOptions{ApproveTools: []string{"read_file"}}, "read_file", false, []string{"read_file"}, "timed out", true, false},
		{"approved, it runs", "spawn", read + "\nsay done", protocol.StartOptions{ApproveTools: []string{"read_file"}, RequestTimeoutMs: 60_000}, "read_file", true, []string{"read_file"}, "secret plans", false, false},
		{"a grandchild inherits", "spawn", delegate(read+"\nsay ok") + "\nsay done", protocol.StartOptions{ApproveTools: []string{"read_file"}}, "read_file", false, []string{"read_file"}, "timed out", true, true},
		{"the provider's bind every start", "guarded", `call list_dir {"path":"."}` + "\nsay done", protocol.StartOptions{}, "list_dir", false, []string{"list_dir"}, "timed out", true, false},
		{"and add to the start's", "guarded", read + "\nsay done", protocol.StartOptions{ApproveTools: []string{"read_file"}}, "read_file", false, []string{"list_dir", "read_file"}, "timed out", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("secret plans"), 0o600); err != nil {
				t.Fatal(err)
			}
			root := s.Root(dir)
			approved := make(chan error, 1)
			actx, stopApproving := context.WithTimeout(context.Background(), 60*time.Second)
			defer stopApproving()
			if tt.approve {
				go func() { approved <- approveOne(actx, s, tt.tool) }()
			}
			run, res, err := s.Run(root.Ref(), tt.provider, tt.prompt, tt.opts)
			stopApproving()
			if tt.approve {
				if err := <-approved; err != nil {
					t.Fatal(err)
				}
			}
			if err != nil || res.StopReason != protocol.StopCompleted {
				t.Fatalf("run: %+v, %v", res, err)
			}
			header, evs := s.Log(run.ChildID)
			if tt.deeper {
				id := ""
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
			}
			if !slices.Equal(header.ApproveTools, tt.want) {
				t.Fatalf("the header's approveTools = %v, want %v", header.ApproveTools, tt.want)
			}
			var got *protocol.ToolResultData
			asked := 0
			for _, ev := range evs {
				var d protocol.ToolResultData
				switch {
				case ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.Name == tt.tool:
					got = &d
				case ev.Type == protocol.EvRequestOpen:
					asked++
				}
			}
			if got == nil || got.IsError != tt.isError || !strings.Contains(protocol.PlainText(got.Content), tt.result) {
				t.Fatalf("%s result = %+v, want error %v containing %q", tt.tool, got, tt.isError, tt.result)
			}
			if want := min(len(tt.want), 1); asked != want {
				t.Fatalf("%d requests opened, want %d", asked, want)
			}
		})
	}
	t.Run("bad names are refused", func(t *testing.T) {
		for _, o := range []protocol.StartOptions{
			{ApproveTools: []string{"rm_rf"}},
			{ApproveTools: []string{"write_file"}, AutoApprove: []string{"write_file"}},
		} {
			if _, _, err := s.Run(s.Root().Ref(), "spawn", "say hi", o); protocol.CodeOf(err) != protocol.CodeInvalidArgument {
				t.Fatalf("start with %+v = %v, want INVALID_ARGUMENT", o, err)
			}
		}
		if _, _, err := s.Run(s.Root().Ref(), "guarded", "say hi", protocol.StartOptions{AutoApprove: []string{"list_dir"}}); protocol.CodeOf(err) != protocol.CodeInvalidArgument ||
			!strings.Contains(err.Error(), "list_dir must ask") {
			t.Fatalf("allowing outright what the provider guards = %v, want INVALID_ARGUMENT", err)
		}
	})
	t.Run("a provider's unknown name fails its host", func(t *testing.T) {
		bad := worker.InProcessDescriptor("guarded", false)
		bad.ApproveTools = []string{"rm_rf"}
		nc := s.Conn()
		_, err := worker.NewInProcessHost(worker.InProcessConfig{NC: nc, Store: s.Store, Models: func() (model.Model, error) { return model.NewScripted(), nil }}, bad)
		if protocol.CodeOf(err) != protocol.CodeInvalidArgument || !strings.Contains(err.Error(), "rm_rf") {
			t.Fatalf("a host whose descriptor asks for an unknown tool = %v, want INVALID_ARGUMENT naming it", err)
		}
	})
}

// approveOne approves the one request pending for tool once it is listed;
// it returns why it could not (ctx ended first, another tool asked).
func approveOne(ctx context.Context, s *stack.Stack, tool string) error {
	for {
		l, err := s.Client.Requests(ctx, protocol.RequestsListRequest{Authority: s.Grant()})
		if err == nil && len(l.Requests) > 0 {
			req := l.Requests[0]
			if req.Tool != tool {
				return fmt.Errorf("the request is for %q, want %q", req.Tool, tool)
			}
			_, err := s.Client.AnswerRequest(ctx, protocol.RequestAnswerRequest{RequestID: req.ID, Authority: s.Grant(), Answer: protocol.AnswerApprove})
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no request for %s was pending: %w (last list: %v)", tool, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
