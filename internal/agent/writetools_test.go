package agent

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestWriteToolsStayInTheWorkspace (issue 33, item 3): write_file and
// edit_file act only inside the session's workspace, under the worker's
// roots, by the rule read_file follows; edit_file needs one exact match.
func TestWriteToolsStayInTheWorkspace(t *testing.T) {
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	must(t, os.MkdirAll(ws, 0o755))
	must(t, os.WriteFile(filepath.Join(base, "outside.txt"), []byte("keep"), 0o644))
	must(t, os.WriteFile(filepath.Join(ws, "a.txt"), []byte("one two two"), 0o644))
	must(t, os.Symlink(base, filepath.Join(ws, "up")))
	must(t, os.Symlink(filepath.Join(base, "outside.txt"), filepath.Join(ws, "link.txt")))

	tests := []struct {
		name  string
		tool  *Tool
		roots []string
		args  string
		want  string // text the result contains
		ok    bool
		file  string // when set, its content afterwards (relative to base)
		has   string
	}{
		{"write a new file in a new directory", WriteFileTool(ws), []string{ws}, `{"path":"d/e/new.txt","content":"hi"}`, "wrote 2 bytes", true, "ws/d/e/new.txt", "hi"},
		{"write replaces a file", WriteFileTool(ws), []string{ws}, `{"path":"b.txt","content":"new"}`, "wrote 3 bytes", true, "ws/b.txt", "new"},
		{"write outside by ..", WriteFileTool(ws), []string{ws}, `{"path":"../outside.txt","content":"x"}`, "outside the workspace", false, "outside.txt", "keep"},
		{"write outside by an absolute path", WriteFileTool(ws), []string{ws}, `{"path":` + strconv.Quote(filepath.Join(base, "x.txt")) + `,"content":"x"}`, "outside the workspace", false, "", ""},
		{"write through a symlinked directory", WriteFileTool(ws), []string{ws}, `{"path":"up/new.txt","content":"x"}`, "outside the workspace", false, "", ""},
		{"write through a symlinked file", WriteFileTool(ws), []string{ws}, `{"path":"link.txt","content":"x"}`, "outside the workspace", false, "outside.txt", "keep"},
		{"write with no root", WriteFileTool(), nil, `{"path":"c.txt","content":"x"}`, "allows no workspace", false, "", ""},
		{"write in a workspace outside the roots", WriteFileTool(filepath.Join(base, "other")), nil, `{"path":"c.txt","content":"x"}`, "outside this worker's workspace roots", false, "", ""},
		{"write over the limit", WriteFileTool(ws), []string{ws}, `{"path":"big.txt","content":"` + strings.Repeat("x", WriteFileBytesMax+1) + `"}`, "the limit is", false, "", ""},
		{"edit a unique match", EditFileTool(ws), []string{ws}, `{"path":"a.txt","old_string":"one","new_string":"1"}`, "replaced 1", true, "ws/a.txt", "1 two two"},
		{"edit an ambiguous match", EditFileTool(ws), []string{ws}, `{"path":"a.txt","old_string":"two","new_string":"2"}`, "occurs 2 times", false, "ws/a.txt", "1 two two"},
		{"edit every match", EditFileTool(ws), []string{ws}, `{"path":"a.txt","old_string":"two","new_string":"2","replace_all":true}`, "replaced 2", true, "ws/a.txt", "1 2 2"},
		{"edit no match", EditFileTool(ws), []string{ws}, `{"path":"a.txt","old_string":"zzz","new_string":"2"}`, "not found", false, "ws/a.txt", "1 2 2"},
		{"edit outside", EditFileTool(ws), []string{ws}, `{"path":"../outside.txt","old_string":"keep","new_string":"lost"}`, "outside the workspace", false, "outside.txt", "keep"},
		{"edit through a symlink", EditFileTool(ws), []string{ws}, `{"path":"link.txt","old_string":"keep","new_string":"lost"}`, "outside the workspace", false, "outside.txt", "keep"},
		{"edit unknown field", EditFileTool(ws), []string{ws}, `{"path":"a.txt","old":"1","new_string":"2"}`, "invalid arguments", false, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc := ToolContext{Header: protocol.SessionHeader{Cwd: ws}}
			r := tt.tool.Run(context.Background(), tc, tt.args)
			got := protocol.PlainText(r.Content)
			if r.IsError == tt.ok || !strings.Contains(got, tt.want) {
				t.Fatalf("%s %.80s = (error %v) %q, want error %v containing %q", tt.tool.Name, tt.args, r.IsError, got, !tt.ok, tt.want)
			}
			if tt.file != "" {
				data, err := os.ReadFile(filepath.Join(base, tt.file))
				if err != nil || string(data) != tt.has {
					t.Fatalf("%s holds %q, %v; want %q", tt.file, data, err, tt.has)
				}
			}
		})
	}
	if _, err := os.Stat(filepath.Join(base, "new.txt")); err == nil {
		t.Fatal("a write through a symlink made a file outside the workspace")
	}
}

// TestRunCommandIsBounded (issue 33, item 3): run_command runs in the
// workspace; outside the roots, past its timeout or past its output bound
// it is an error result (the group killed); the worker's secrets are not in
// its environment.
func TestRunCommandIsBounded(t *testing.T) {
	ws := t.TempDir()
	must(t, os.WriteFile(filepath.Join(ws, "f.txt"), []byte("in the workspace"), 0o644))
	t.Setenv("NATS_PASSWORD", "nats-secret-1")
	t.Setenv("OPENAI_API_KEY", "model-secret-2")
	t.Setenv("BROOD_GRANT", "brood-secret-3")
	t.Setenv("SOME_OTHER", "other-secret-4")
	pidFile := filepath.Join(ws, "bg.pid")
	tests := []struct {
		name  string
		roots []string
		cwd   string
		args  string
		want  []string // texts the result contains
		not   []string // texts it must not contain
		ok    bool
	}{
		{"runs in the workspace", []string{ws}, ws, `{"command":"cat f.txt; pwd"}`, []string{"in the workspace", ws, "exit status 0"}, nil, true},
		{"a failing command", []string{ws}, ws, `{"command":"echo oops >&2; exit 3"}`, []string{"oops", "exit status 3"}, nil, false},
		{"the worker's secrets are not in its environment", []string{ws}, ws, `{"command":"env"}`, []string{"PATH="},
			[]string{"nats-secret-1", "model-secret-2", "brood-secret-3", "other-secret-4", "NATS_PASSWORD", "BROOD_"}, true},
		{"no root", nil, ws, `{"command":"echo hi"}`, []string{"allows no workspace"}, []string{"hi\n"}, false},
		{"a dir outside the workspace", []string{ws}, ws, `{"command":"echo hi","dir":".."}`, []string{"outside the workspace"}, []string{"hi\n"}, false},
		{"a workspace outside the roots", []string{filepath.Join(ws, "sub")}, ws, `{"command":"echo hi"}`, []string{"outside this worker's workspace roots"}, nil, false},
		{"past its timeout", []string{ws}, ws, `{"command":"echo started; sleep 30","timeout_seconds":1}`, []string{"past its timeout of 1s", "started"}, nil, false},
		{"past its output bound", []string{ws}, ws, `{"command":"head -c ` + strconv.Itoa(RunCommandOutputBytesMax+1) + ` /dev/zero | tr '\\0' x; sleep 30"}`,
			[]string{"more than " + strconv.Itoa(RunCommandOutputBytesMax) + " bytes"}, []string{"xxxx"}, false},
		{"a background process does not hold the turn", []string{ws}, ws, `{"command":"sleep 30 & echo $! > bg.pid; echo fg"}`, []string{"fg"}, nil, true},
		{"a bad timeout", []string{ws}, ws, `{"command":"true","timeout_seconds":0}`, []string{"timeout_seconds must be"}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc := ToolContext{Header: protocol.SessionHeader{Cwd: tt.cwd}}
			start := time.Now()
			r := RunCommandTool(tt.roots...).Run(context.Background(), tc, tt.args)
			got := protocol.PlainText(r.Content)
			if r.IsError == tt.ok {
				t.Fatalf("run_command %s = (error %v) %q, want error %v", tt.args, r.IsError, got, !tt.ok)
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Fatalf("run_command %s = %q, want it to contain %q", tt.args, got, w)
				}
			}
			for _, n := range tt.not {
				if strings.Contains(got, n) {
					t.Fatalf("run_command %s = %q, must not contain %q", tt.args, got, n)
				}
			}
			// Killed, not waited out: well before the commands' sleep 30.
			if d := time.Since(start); d > 20*time.Second {
				t.Fatalf("run_command %s took %s", tt.args, d)
			}
		})
	}
	// The background sleep was killed with its group.
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("the background process %d outlived its command", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestApprovalToolsNeedApproval (issue 33, item 3): a tool that needs
// approval runs only when the session's header allows it outright; else
// the call is an error result, nothing is written, and the turn goes on.
func TestApprovalToolsNeedApproval(t *testing.T) {
	tests := []struct {
		name        string
		autoApprove []string
		written     bool
	}{
		{"asked for, no one to ask", nil, false},
		{"another tool allowed", []string{"run_command"}, false},
		{"allowed outright", []string{"write_file"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := t.TempDir()
			reg, err := NewRegistry(WriteFileTool(ws), RunCommandTool(ws))
			must(t, err)
			log := &memLog{}
			a, err := New(Config{Header: protocol.SessionHeader{ID: "S1", Cwd: ws, AutoApprove: tt.autoApprove}, Log: log, Model: model.NewScripted(), Tools: reg})
			must(t, err)
			out := a.RunTurn(context.Background(), userInput(`call write_file {"path":"x.txt","content":"hi"}`+"\nsay done"))
			if out.Reason.Kind != protocol.TurnCompleted {
				t.Fatalf("outcome = %+v, want the turn completed", out)
			}
			var res protocol.ToolResultData
			for _, ev := range a.Events() {
				if ev.Type == protocol.EvToolResult {
					must(t, ev.Decode(&res))
				}
			}
			_, statErr := os.Stat(filepath.Join(ws, "x.txt"))
			if written := statErr == nil; written != tt.written || res.IsError == tt.written {
				t.Fatalf("written %v, result (error %v) %q; want written %v", written, res.IsError, protocol.PlainText(res.Content), tt.written)
			}
			if !tt.written && !strings.Contains(protocol.PlainText(res.Content), "needs approval") {
				t.Fatalf("result %q does not say approval is needed", protocol.PlainText(res.Content))
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// processAlive reports whether pid runs (a zombie waiting for its reaper
// counts as ended).
func processAlive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
