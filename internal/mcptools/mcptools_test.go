package mcptools_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/brood-dev/brood/internal/mcptools"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
)

// serverEnv makes this test binary the MCP test server (TestMain).
const serverEnv = "BROOD_MCP_TEST_SERVER"

// TestMain runs the MCP test server when asked (the test binary re-executed
// as a stdio MCP server), else the tests, failing on a leaked goroutine.
func TestMain(m *testing.M) {
	if os.Getenv(serverEnv) == "1" {
		runTestServer()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

type writeIn struct {
	Path    string `json:"path"`
	Content string `json:"content"`
}

// runTestServer is a small MCP server built with the Go SDK: write_file
// writes a file (idempotentHint), hang never answers, crash exits mid-call
// (destructiveHint, no other), has_secret says whether MCP_SECRET reached
// its environment, never its value (readOnlyHint).
func runTestServer() {
	s := mcp.NewServer(&mcp.Implementation{Name: "test-fs", Version: "1"}, nil)
	destructive := true
	mcp.AddTool(s, &mcp.Tool{Name: "write_file", Description: "Write content to the file at path.",
		Annotations: &mcp.ToolAnnotations{IdempotentHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, in writeIn) (*mcp.CallToolResult, any, error) {
			if err := os.WriteFile(in.Path, []byte(in.Content), 0o600); err != nil {
				return nil, nil, err
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("wrote %d bytes", len(in.Content))}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "hang", Description: "Never answers."},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			select {}
		})
	mcp.AddTool(s, &mcp.Tool{Name: "crash", Description: "Exits mid-call.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &destructive}},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			os.Exit(3)
			return nil, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "has_secret", Description: "Whether MCP_SECRET is set.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			_, ok := os.LookupEnv("MCP_SECRET")
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "secret present: " + strconv.FormatBool(ok)}}}, nil, nil
		})
	_ = s.Run(context.Background(), &mcp.StdioTransport{})
}

const secret = "s3cr3t-MCP-token-4711"

// testServer is the config of the test server: this binary, its secret in
// its environment, calls bounded to 2 s.
func testServer(t *testing.T) mcptools.ServerConfig {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return mcptools.ServerConfig{Name: "fs", Command: exe, Args: []string{"-test.run=^$"},
		Env: map[string]string{serverEnv: "1", "MCP_SECRET": secret}, CallTimeout: "2s"}
}

// syncBuffer is a log sink the test reads while services write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// toolResults are the tool results in a session's log, by tool name.
func toolResults(t *testing.T, s *stack.Stack, id string) map[string][]protocol.ToolResultData {
	t.Helper()
	_, events := s.Log(id)
	out := map[string][]protocol.ToolResultData{}
	for _, ev := range events {
		if ev.Type != protocol.EvToolResult {
			continue
		}
		var d protocol.ToolResultData
		if err := ev.Decode(&d); err != nil {
			t.Fatal(err)
		}
		out[d.Name] = append(out[d.Name], d)
	}
	return out
}

// TestSpawnAndForkChildrenUseAnMCPServersTools: a spawn worker configured
// with a stdio MCP server (built with the MCP Go SDK) lists its tools in
// the descriptor; a child calls the writing tool and the file appears; a
// deny filter hides it; a hanging call and a crash mid-call are tool errors
// and the turn completes; a fork child of that child calls the same tool;
// the server's secret appears in no log, event or command line (issue 35,
// acceptance).
func TestSpawnAndForkChildrenUseAnMCPServersTools(t *testing.T) {
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := stack.New(t)
	s.AddCoordinator()
	servers := []mcptools.ServerConfig{testServer(t)}
	s.AddInProcessWorker(worker.InProcessDescriptor("spawn", false), func(c *worker.InProcessConfig) {
		c.MCPServers, c.Logger, c.SubagentProvider, c.SubagentInherits = servers, logger, "fork", true
	})
	s.AddForkWorker(func(c *worker.InProcessConfig) { c.MCPServers, c.Logger = servers, logger })
	root := s.Root()
	dir := t.TempDir()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	provs, err := s.Client.Providers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range provs.Providers {
		if got := strings.Join(d.Tools, ","); got != strings.Join(worker.GlobalTools, ",")+",fs__crash,fs__hang,fs__has_secret,fs__write_file" {
			t.Errorf("%s's descriptor lists tools %s, not the built-in tools then the MCP server's", d.Name, got)
		}
	}

	write := func(name, content string) string {
		args, _ := json.Marshal(map[string]string{"path": filepath.Join(dir, name), "content": content})
		return "call fs__write_file " + string(args)
	}
	for _, tc := range []struct {
		name, prompt string
		filter       *protocol.ToolFilter
		file         string            // the file the turn must have written ("" none)
		absent       string            // a file it must not have written
		results      map[string]string // tool → a text its (first) result holds
		errors       map[string]bool   // tool → whether that result is an error
	}{
		{name: "the child calls the writing tool", prompt: write("a.txt", "from the child") + "\nsay done",
			file: "a.txt", results: map[string]string{"fs__write_file": "wrote 14 bytes"}, errors: map[string]bool{"fs__write_file": false}},
		{name: "a deny filter hides it", prompt: write("denied.txt", "no") + "\nsay done",
			filter: &protocol.ToolFilter{Deny: []string{"fs__write_file"}}, absent: "denied.txt",
			errors: map[string]bool{"fs__write_file": true}},
		{name: "a hanging tool is a tool error within its bound", prompt: "call fs__hang {}\nsay after the hang",
			results: map[string]string{"fs__hang": "did not answer within 2s"}, errors: map[string]bool{"fs__hang": true}},
		{name: "a crash mid-call is a tool error; the next call reconnects", prompt: "call fs__crash {}\nsleep 1ms\n" + write("after-crash.txt", "again") + "\nsay survived",
			file: "after-crash.txt", results: map[string]string{"fs__crash": "failed during crash"}, errors: map[string]bool{"fs__crash": true, "fs__write_file": false}},
		{name: "the secret reaches the server only", prompt: "call fs__has_secret {}\nsay checked",
			results: map[string]string{"fs__has_secret": "secret present: true"}, errors: map[string]bool{"fs__has_secret": false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			began := time.Now()
			run, res, err := s.Run(root.Ref(), "spawn", tc.prompt, protocol.StartOptions{ToolFilter: tc.filter})
			if err != nil || res.StopReason != protocol.StopCompleted {
				t.Fatalf("result %+v, %v", res, err)
			}
			if took := time.Since(began); took > 20*time.Second {
				t.Errorf("the turn took %s", took)
			}
			if tc.file != "" {
				if _, err := os.Stat(filepath.Join(dir, tc.file)); err != nil {
					t.Errorf("the file was not written: %v", err)
				}
			}
			if tc.absent != "" {
				if _, err := os.Stat(filepath.Join(dir, tc.absent)); err == nil {
					t.Errorf("%s was written through a denied tool", tc.absent)
				}
			}
			got := toolResults(t, s, run.ChildID)
			for tool, isErr := range tc.errors {
				if len(got[tool]) == 0 {
					t.Fatalf("no logged result of %s: %+v", tool, got)
				}
				if r := got[tool][0]; r.IsError != isErr {
					t.Errorf("%s: isError %v, want %v (%s)", tool, r.IsError, isErr, protocol.PlainText(r.Content))
				}
			}
			for tool, want := range tc.results {
				if text := protocol.PlainText(got[tool][0].Content); !strings.Contains(text, want) {
					t.Errorf("%s answered %q, want %q", tool, text, want)
				}
			}
		})
	}

	t.Run("a fork of the child calls the same tool", func(t *testing.T) {
		forkPrompt := write("forked.txt", "from the fork") + "\nsay forked"
		args, _ := json.Marshal(map[string]string{"description": "fork", "prompt": forkPrompt})
		run, res, err := s.Run(root.Ref(), "spawn", "call subagent "+string(args)+"\nsay parent done", protocol.StartOptions{})
		if err != nil || res.StopReason != protocol.StopCompleted {
			t.Fatalf("result %+v, %v", res, err)
		}
		sub := toolResults(t, s, run.ChildID)["subagent"]
		if len(sub) != 1 || sub[0].IsError || sub[0].Meta["childId"] == "" {
			t.Fatalf("subagent result %+v", sub)
		}
		if h, _ := s.Log(sub[0].Meta["childId"]); h.Provider != "fork" {
			t.Fatalf("the subagent child is on %s, not fork", h.Provider)
		}
		if data, err := os.ReadFile(filepath.Join(dir, "forked.txt")); err != nil || string(data) != "from the fork" {
			t.Fatalf("the fork child's file: %q, %v", data, err)
		}
	})

	t.Run("the secret is in no log, event or command line", func(t *testing.T) {
		var seen []string
		check := func(what string, data []byte) {
			if bytes.Contains(data, []byte(secret)) {
				seen = append(seen, what)
			}
		}
		check("the workers' logs", []byte(logs.String()))
		rows, err := s.Client.Children(ctx, protocol.ChildrenListRequest{Parent: root.SessionID, Authority: s.Grant(), Descendants: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows.Rows {
			h, events := s.Log(r.ID)
			hj, _ := json.Marshal(h)
			check("the header of "+r.ID, hj)
			for _, ev := range events {
				check("the log of "+r.ID, append([]byte(ev.Type), ev.Data...))
			}
		}
		for _, ev := range s.Lifecycle(root.SessionID) {
			ej, _ := json.Marshal(ev)
			check("a lifecycle event", ej)
		}
		self, _ := os.ReadFile("/proc/self/cmdline")
		check("the worker's command line", self)
		env, _ := os.ReadFile("/proc/self/environ")
		check("the worker's environment", env)
		// The MCP server processes (children of this process): their command lines.
		procs, _ := filepath.Glob("/proc/[0-9]*/stat")
		servers := 0
		for _, p := range procs {
			stat, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
			if len(fields) < 2 || fields[1] != strconv.Itoa(os.Getpid()) {
				continue
			}
			cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
			if bytes.Contains(cmdline, []byte("-test.run=^$")) {
				servers++
				check("an MCP server's command line", cmdline)
			}
		}
		if servers < 2 {
			t.Errorf("found %d MCP server processes, want one per worker", servers)
		}
		if len(seen) > 0 {
			t.Errorf("the secret appears in %s", strings.Join(seen, ", "))
		}
	})
}

// TestToolsAreIdempotentByTheirAnnotations: a server's tool is Idempotent
// (run again when a continued turn finds its call without a result) when
// its annotations say readOnlyHint or idempotentHint, and not otherwise:
// no annotations, or only destructiveHint (issue 31, item 2).
func TestToolsAreIdempotentByTheirAnnotations(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	set, err := mcptools.Start(ctx, []mcptools.ServerConfig{testServer(t)}, testutil.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	want := map[string]bool{"fs__write_file": true, "fs__has_secret": true, "fs__hang": false, "fs__crash": false}
	got := map[string]bool{}
	for _, tool := range set.Tools() {
		got[tool.Name] = tool.Idempotent
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("idempotent tools %v, want %v", got, want)
	}
	for _, tc := range []struct {
		name string
		a    *mcp.ToolAnnotations
		want bool
	}{
		{"none", nil, false},
		{"empty", &mcp.ToolAnnotations{}, false},
		{"read-only", &mcp.ToolAnnotations{ReadOnlyHint: true}, true},
		{"idempotent", &mcp.ToolAnnotations{IdempotentHint: true}, true},
		{"not destructive only", &mcp.ToolAnnotations{DestructiveHint: new(bool)}, false},
		{"closed world only", &mcp.ToolAnnotations{OpenWorldHint: new(bool), Title: "t"}, false},
	} {
		if got := mcptools.Idempotent(tc.a); got != tc.want {
			t.Errorf("%s: Idempotent %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestStartRefusesAnUnreachableServer: a worker whose MCP server cannot be
// started is not built (its descriptor would list tools it cannot call).
func TestStartRefusesAnUnreachableServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := mcptools.Start(ctx, []mcptools.ServerConfig{{Name: "gone", Command: filepath.Join(t.TempDir(), "no-such-server"),
		Env: map[string]string{"TOKEN": secret}}}, testutil.Logger(t))
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("start: %v", err)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfgs []mcptools.ServerConfig
		want string
	}{
		{"bad name", []mcptools.ServerConfig{{Name: "a__b", Command: "x"}}, "name"},
		{"twice", []mcptools.ServerConfig{{Name: "a", Command: "x"}, {Name: "a", URL: "http://h/mcp"}}, "twice"},
		{"neither", []mcptools.ServerConfig{{Name: "a"}}, "exactly one"},
		{"both", []mcptools.ServerConfig{{Name: "a", Command: "x", URL: "http://h/mcp"}}, "exactly one"},
		{"bad url", []mcptools.ServerConfig{{Name: "a", URL: "ftp://h"}}, "http(s)"},
		{"bad timeout", []mcptools.ServerConfig{{Name: "a", Command: "x", CallTimeout: "soon"}}, "callTimeout"},
		{"ok", []mcptools.ServerConfig{{Name: "a", Command: "x", CallTimeout: "5s"}, {Name: "b-2", URL: "https://h/mcp"}}, ""},
	} {
		err := mcptools.Validate(tc.cfgs)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if got := mcptools.ToolName("fs", "read.file/v2"); got != "fs__read_file_v2" {
		t.Errorf("ToolName %s", got)
	}
}
