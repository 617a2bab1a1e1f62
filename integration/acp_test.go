package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/acpio"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
	acpbridge "github.com/brood-dev/brood/services/acp-bridge"
)

// The ACP tests run the bridge against agents this project did not write,
// installed by `make acp-deps` at known paths (docs/design.md §6): the ACP Go
// SDK's example agent, @zed-industries/codex-acp, and an agent written here
// with the ACP TypeScript SDK. They fail, never skip, when one is missing.
const (
	goExampleAgent = "../.deps/bin/agent"
	acpNodeDir     = "testdata/acp"
	codexACP       = acpNodeDir + "/node_modules/.bin/codex-acp"
	tsAgentScript  = acpNodeDir + "/ts-agent.mjs"
	tsSDK          = acpNodeDir + "/node_modules/@agentclientprotocol/sdk/package.json"
)

// acpDep returns the absolute path of a test dependency, failing the test
// when it is not installed.
func acpDep(t *testing.T, rel string) string {
	t.Helper()
	abs, err := filepath.Abs(rel)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		t.Fatalf("ACP test dependency %s is missing (%v): run `make acp-deps`, which installs the ACP Go SDK example agent and the npm packages of %s", abs, err, acpNodeDir)
	}
	return abs
}

var (
	fakeOnce sync.Once
	fakeBin  string
	fakeErr  error
)

// fakeAgent builds the scripted fault agent once.
func fakeAgent(t *testing.T) string {
	t.Helper()
	fakeOnce.Do(func() {
		fakeBin = filepath.Join(filepath.Dir(broodBin), "acpfake")
		out, err := exec.Command("go", "build", "-o", fakeBin, "./acpfake").CombinedOutput()
		if err != nil {
			fakeErr = err
			t.Logf("%s", out)
		}
	})
	if fakeErr != nil {
		t.Fatalf("build the fake ACP agent: %v", fakeErr)
	}
	return fakeBin
}

// acpTestOptions are short bounds so fault tests of the fake agent finish
// quickly.
func acpTestOptions(t *testing.T) acpbridge.Options {
	return acpbridge.Options{
		SilenceTimeout: 2 * time.Second, EOFGrace: 300 * time.Millisecond, TermGrace: 300 * time.Millisecond,
		Logger: testutil.Logger(t),
	}
}

// realAgentOptions are acpTestOptions for real agents (node, the Go SDK's
// example): their start-up on a loaded machine can take longer than the
// fake agent's silence bound, which they do not test.
func realAgentOptions(t *testing.T) acpbridge.Options {
	o := acpTestOptions(t)
	o.SilenceTimeout = 30 * time.Second
	return o
}

// acpStack is a stack with a coordinator and an in-process ACP bridge host
// serving agents.
func acpStack(t *testing.T, o acpbridge.Options, agents ...acpbridge.AgentConfig) *stack.Stack {
	t.Helper()
	s := stack.New(t)
	s.AddCoordinator()
	ps, err := acpbridge.Providers(agents, o)
	if err != nil {
		t.Fatal(err)
	}
	s.AddHost(ps...)
	return s
}

func eventTypes(evs []protocol.SessionEvent) string {
	var ts []string
	for _, e := range evs {
		ts = append(ts, e.Type)
	}
	return strings.Join(ts, " ")
}

// firstUserSource is the source of the first user/message in evs.
func firstUserSource(t *testing.T, evs []protocol.SessionEvent) protocol.MessageSource {
	t.Helper()
	for _, ev := range evs {
		var d protocol.UserMessageData
		if ev.Type == protocol.EvUserMessage && ev.Decode(&d) == nil {
			return d.Source
		}
	}
	t.Fatalf("no user/message in %s", eventTypes(evs))
	return protocol.MessageSource{}
}

func acpTurnEnd(t *testing.T, evs []protocol.SessionEvent) protocol.TurnEndReason {
	t.Helper()
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Type == protocol.EvTurnEnd {
			var d protocol.TurnEndData
			if err := evs[i].Decode(&d); err != nil {
				t.Fatal(err)
			}
			return d.Reason
		}
	}
	t.Fatalf("no turn/end in %s", eventTypes(evs))
	return protocol.TurnEndReason{}
}

func TestACPFakeAgentOneShot(t *testing.T) {
	s := acpStack(t, acpTestOptions(t), acpbridge.AgentConfig{Name: "fake", Command: fakeAgent(t)})
	root := s.Root()
	run, res, err := s.Run(root.Ref(), "fake", "echo hi", protocol.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != "echo: hi" {
		t.Fatalf("result %+v", res)
	}
	if run.RunID == run.ChildID {
		t.Fatalf("an ACP run id must differ from its child id: %s", run.RunID)
	}
	_, evs := s.Log(run.ChildID)
	want := "turn/start user/message subagent/descriptor acp/session step/start assistant/message step/end turn/end"
	if got := eventTypes(evs); got != want {
		t.Fatalf("log %s\nwant %s", got, want)
	}
	var sess protocol.ACPSessionData
	if err := evs[3].Decode(&sess); err != nil || sess.SessionID != "fake-session-1" || sess.LoadSession || sess.Agent != "acpfake 1" {
		t.Fatalf("acp/session %+v %v", sess, err)
	}
}

// runFor starts a run and waits for its result, failing the test after total.
func runFor(t *testing.T, s *stack.Stack, parent protocol.ParentRef, provider, prompt string, total time.Duration) (runIDs [2]string, res protocol.SubagentResult, took time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), total)
	defer cancel()
	start := time.Now()
	run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: parent, Provider: provider, Prompt: protocol.Text(prompt), Options: protocol.StartOptions{}})
	if err != nil {
		t.Fatalf("start %q on %s: %v", prompt, provider, err)
	}
	res, err = run.Result(ctx)
	if err != nil {
		t.Fatalf("result of %q on %s: %v", prompt, provider, err)
	}
	return [2]string{run.RunID, run.ChildID}, res, time.Since(start)
}

// toolEvents renders a log's tool calls and results as "call ID NAME" and
// "result ID ok|error".
func toolEvents(t *testing.T, evs []protocol.SessionEvent) []string {
	t.Helper()
	var out []string
	for _, e := range evs {
		switch e.Type {
		case protocol.EvToolCall:
			var d protocol.ToolCallData
			if err := e.Decode(&d); err != nil {
				t.Fatal(err)
			}
			out = append(out, "call "+d.CallID+" "+d.Name)
		case protocol.EvToolResult:
			var d protocol.ToolResultData
			if err := e.Decode(&d); err != nil {
				t.Fatal(err)
			}
			status := "ok"
			if d.IsError {
				status = "error"
			}
			out = append(out, "result "+d.CallID+" "+status)
		}
	}
	return out
}

// TestACPGoSDKExampleAgent runs full turns of the ACP Go SDK's example agent
// (about 5 s each): streamed text, two tool calls, one permission request.
func TestACPGoSDKExampleAgent(t *testing.T) {
	bin := acpDep(t, goExampleAgent)
	s := acpStack(t, realAgentOptions(t),
		acpbridge.AgentConfig{Name: "example-allow", Command: bin, Permission: acpbridge.PolicyAllow},
		acpbridge.AgentConfig{Name: "example-reject", Command: bin, Permission: acpbridge.PolicyReject})
	root := s.Root()
	tests := []struct {
		provider string
		has      string
		lacks    string
		tools    string
	}{
		// allowed: the agent applies the change and says so
		{"example-allow", "Perfect! I've successfully updated the configuration.", "skip the configuration update",
			"call call_1 Reading project files|result call_1 ok|call call_2 Modifying critical configuration file|result call_2 ok"},
		// rejected: the agent's reject_once option is selected (issue 14),
		// so it says it skips the change, end_turn; the pending call is closed
		{"example-reject", "I'll skip the configuration update.", "Perfect!",
			"call call_1 Reading project files|result call_1 ok|call call_2 Modifying critical configuration file|result call_2 error"},
	}
	for _, tt := range tests {
		t.Run(tt.provider, func(t *testing.T) {
			t.Parallel()
			ids, res, took := runFor(t, s, root.Ref(), tt.provider, "change the config", 30*time.Second)
			out := protocol.PlainText(res.Output)
			if res.StopReason != protocol.StopCompleted || !strings.HasPrefix(out, "ACP Go Example Agent") ||
				!strings.Contains(out, tt.has) || strings.Contains(out, tt.lacks) {
				t.Fatalf("result %s %q (%s)", res.StopReason, out, res.Diagnostic)
			}
			_, evs := s.Log(ids[1])
			if got := strings.Join(toolEvents(t, evs), "|"); got != tt.tools {
				t.Fatalf("tool events %s\nwant %s", got, tt.tools)
			}
			t.Logf("%s: %s", tt.provider, took)
		})
	}
}

// TestACPTypeScriptAgent runs an agent written with the ACP TypeScript SDK:
// chunked answers and a single chunk far over 64 KiB.
func TestACPTypeScriptAgent(t *testing.T) {
	acpDep(t, tsSDK)
	script := acpDep(t, tsAgentScript)
	s := acpStack(t, realAgentOptions(t), acpbridge.AgentConfig{Name: "ts", Command: "node", Args: []string{script},
		Env: map[string]string{"TS_AGENT_STATE_DIR": t.TempDir()}})
	root := s.Root()
	t.Run("chunks", func(t *testing.T) {
		t.Parallel()
		_, res, took := runFor(t, s, root.Ref(), "ts", "hello from Brood", 30*time.Second)
		if res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != "ts: hello from Brood" {
			t.Fatalf("result %+v", res)
		}
		t.Logf("took %s", took)
	})
	t.Run("a 200 KiB line", func(t *testing.T) {
		t.Parallel()
		_, res, _ := runFor(t, s, root.Ref(), "ts", "long 204800", 30*time.Second)
		if res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != strings.Repeat("z", 204800) {
			t.Fatalf("result %s, %d bytes (%s)", res.StopReason, len(protocol.PlainText(res.Output)), res.Diagnostic)
		}
	})
}

// TestACPCodexAuthenticationRequired: codex-acp answers initialize without
// credentials, then refuses session/new; the run ends error, fast, saying so.
func TestACPCodexAuthenticationRequired(t *testing.T) {
	bin := acpDep(t, codexACP)
	const bound = 20 * time.Second
	s := acpStack(t, realAgentOptions(t), acpbridge.AgentConfig{Name: "codex", Command: bin,
		Env: map[string]string{"HOME": t.TempDir()}})
	root := s.Root()
	ids, res, took := runFor(t, s, root.Ref(), "codex", "say hi", bound)
	if res.StopReason != protocol.StopError || !strings.Contains(res.Diagnostic, "Authentication required") ||
		!strings.Contains(res.Diagnostic, "requires authentication") {
		t.Fatalf("result %+v", res)
	}
	_, evs := s.Log(ids[1])
	if got, want := eventTypes(evs), "turn/start user/message subagent/descriptor turn/end"; got != want {
		t.Fatalf("log %s, want %s", got, want)
	}
	t.Logf("codex-acp: error after %s: %s", took, res.Diagnostic)
}

func TestACPFaults(t *testing.T) {
	fake := fakeAgent(t)
	o := acpTestOptions(t)
	small := o
	small.LineBytesMax = 1 << 20
	env := o
	env.Environ = func() []string {
		return []string{"PATH=" + os.Getenv("PATH"), "OPENAI_API_KEY=sk-ambient", "GITHUB_TOKEN=gh-ambient", "BROOD_NATS_URL=nats://x", "LANG=C.UTF-8"}
	}
	mk := func(a acpbridge.AgentConfig, o acpbridge.Options) *acpbridge.Provider {
		p, err := acpbridge.NewProvider(a, o)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	s := stack.New(t)
	s.AddCoordinator()
	s.AddHost(
		mk(acpbridge.AgentConfig{Name: "fake", Command: fake}, o),
		mk(acpbridge.AgentConfig{Name: "fake-allow", Command: fake, Permission: acpbridge.PolicyAllow}, o),
		mk(acpbridge.AgentConfig{Name: "fake-small", Command: fake}, small),
		mk(acpbridge.AgentConfig{Name: "fake-env", Command: fake, Env: map[string]string{"MY_API_TOKEN": "explicit-tok", "BROOD_FACT": "kept"}}, env),
		mk(acpbridge.AgentConfig{Name: "missing", Command: "/nonexistent/acp-agent"}, o),
	)
	dir := t.TempDir()
	root := s.Root(dir)
	type check func(t *testing.T, res protocol.SubagentResult, evs []protocol.SessionEvent, took time.Duration)
	is := func(stop protocol.StopReason, output, diag string, within time.Duration) check {
		return func(t *testing.T, res protocol.SubagentResult, _ []protocol.SessionEvent, took time.Duration) {
			t.Helper()
			if res.StopReason != stop || protocol.PlainText(res.Output) != output || !strings.Contains(res.Diagnostic, diag) {
				t.Fatalf("result %s %.200q diagnostic %q; want %s %.200q with %q", res.StopReason, protocol.PlainText(res.Output), res.Diagnostic, stop, output, diag)
			}
			if took > within {
				t.Fatalf("took %s, over %s", took, within)
			}
		}
	}
	permissionCheck := func(output string, counts protocol.PermissionCounts) check {
		return func(t *testing.T, res protocol.SubagentResult, evs []protocol.SessionEvent, _ time.Duration) {
			t.Helper()
			if res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != output {
				t.Fatalf("result %+v, want completed %q", res, output)
			}
			if res.Permissions == nil || *res.Permissions != counts {
				t.Fatalf("result permissions %+v, want %+v", res.Permissions, counts)
			}
			var logged []protocol.ACPPermissionData
			for _, ev := range evs {
				var d protocol.ACPPermissionData
				if ev.Type == protocol.EvACPPermission && ev.Decode(&d) == nil {
					logged = append(logged, d)
				}
			}
			if len(logged) != 1 || logged[0].ToolCallID != "p1" || logged[0].Granted != (counts.Granted == 1) {
				t.Fatalf("acp/permission events %+v", logged)
			}
		}
	}
	tests := []struct {
		name, provider, prompt string
		check                  check
	}{
		{"stray stdout text", "fake", "junk", is(protocol.StopCompleted, "after junk", "", 10*time.Second)},
		{"a 300 KiB line", "fake", "long 307200", is(protocol.StopCompleted, strings.Repeat("x", 307200), "", 10*time.Second)},
		{"a line over the limit", "fake-small", "huge 1100000", is(protocol.StopError, "", "over the 1048576-byte limit", 10*time.Second)},
		// Issue 14, item 7: a line that crosses the limit and never ends fails
		// the turn at once, saying so (not after the silence bound, as silence).
		{"a line over the limit that never ends", "fake-small", "endless 1100000", is(protocol.StopError, "", "over the 1048576-byte limit", 10*time.Second)},
		// Issue 14, item 6: output that trails the prompt's answer is not lost.
		{"output trailing the answer", "fake", "trailing 20ms", is(protocol.StopCompleted, "main trailing", "", 10*time.Second)},
		{"dies mid-turn", "fake", "die", is(protocol.StopError, "partial", "exited (exit status 3) during session/prompt; the end of its stderr: fatal: the fake agent crashed on purpose", 5*time.Second)},
		{"goes silent", "fake", "silent", is(protocol.StopError, "partial", "sent no message for", 6*time.Second)},
		{"refusal", "fake", "refuse", is(protocol.StopRefusal, "I will not", "", 10*time.Second)},
		{"max tokens", "fake", "maxtokens", is(protocol.StopMaxTokens, "partial", "", 10*time.Second)},
		{"cancelled by the agent", "fake", "cancelled", is(protocol.StopAborted, "", "", 10*time.Second)},
		{"max_turn_requests", "fake", "maxturns", is(protocol.StopError, "", `stop reason "max_turn_requests"`, 10*time.Second)},
		// Issue 14, item 5: the reject option is selected, and the request,
		// its answer and the count are in the log and the result.
		{"permission rejected", "fake", "permission", permissionCheck("selected no", protocol.PermissionCounts{Requested: 1, Denied: 1})},
		{"permission rejected, no reject option offered", "fake", "permission-allow-only", permissionCheck("cancelled", protocol.PermissionCounts{Requested: 1, Denied: 1})},
		{"permission allowed", "fake-allow", "permission", permissionCheck("selected yes", protocol.PermissionCounts{Requested: 1, Granted: 1})},
		{"command not found", "missing", "echo x", is(protocol.StopError, "", `could not start the ACP agent "/nonexistent/acp-agent"`, 10*time.Second)},
		{"cwd is the parent's", "fake", "cwd", is(protocol.StopCompleted, dir, "", 10*time.Second)},
		{"tool calls", "fake", "tools", func(t *testing.T, res protocol.SubagentResult, evs []protocol.SessionEvent, _ time.Duration) {
			if res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != "read them" {
				t.Fatalf("result %+v", res)
			}
			if got, want := strings.Join(toolEvents(t, evs), "|"), "call t1 Read notes|result t1 ok|call t2 Edit notes|result t2 error"; got != want {
				t.Fatalf("tool events %s, want %s", got, want)
			}
		}},
		{"scrubbed environment", "fake-env", "env", func(t *testing.T, res protocol.SubagentResult, _ []protocol.SessionEvent, _ time.Duration) {
			env := "\n" + protocol.PlainText(res.Output) + "\n"
			for _, want := range []string{"\nMY_API_TOKEN=explicit-tok\n", "\nBROOD_FACT=kept\n", "\nLANG=C.UTF-8\n", "\nPATH="} {
				if !strings.Contains(env, want) {
					t.Errorf("environment lacks %q:%s", want, env)
				}
			}
			for _, bad := range []string{"sk-ambient", "gh-ambient", "BROOD_NATS_URL"} {
				if strings.Contains(env, bad) {
					t.Errorf("environment has %q:%s", bad, env)
				}
			}
		}},
		{"lineage in _meta", "fake", "meta", func(t *testing.T, res protocol.SubagentResult, _ []protocol.SessionEvent, _ time.Duration) {
			var meta map[string]protocol.ACPLineage
			if err := json.Unmarshal([]byte(protocol.PlainText(res.Output)), &meta); err != nil {
				t.Fatalf("meta %q: %v", protocol.PlainText(res.Output), err)
			}
			if l := meta[protocol.ACPMetaKey]; l.ParentSession != root.SessionID || l.DelegationDepth != 1 {
				t.Fatalf("lineage %+v", l)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ids, res, took := runFor(t, s, root.Ref(), tt.provider, tt.prompt, 30*time.Second)
			_, evs := s.Log(ids[1])
			tt.check(t, res, evs, took)
			if r := acpTurnEnd(t, evs); r.Kind != map[protocol.StopReason]string{
				protocol.StopCompleted: protocol.TurnCompleted, protocol.StopError: protocol.TurnError, protocol.StopRefusal: protocol.TurnBlocked,
				protocol.StopMaxTokens: protocol.TurnMaxTokens, protocol.StopAborted: protocol.TurnAborted}[res.StopReason] {
				t.Fatalf("turn/end %+v for stop reason %s", r, res.StopReason)
			}
		})
	}
}

// TestACPDisposeKillsTheProcessTree disposes a run whose agent ignores
// session/cancel, stdin EOF and SIGTERM and has started a grandchild that
// ignores SIGTERM too: the run settles aborted at once with the partial
// output, and teardown leaves no process of the agent's group behind.
func TestACPDisposeKillsTheProcessTree(t *testing.T) {
	s := acpStack(t, acpTestOptions(t), acpbridge.AgentConfig{Name: "fake", Command: fakeAgent(t)})
	dir := t.TempDir()
	root := s.Root(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "fake", Prompt: protocol.Text("stubborn"), Options: protocol.StartOptions{}})
	if err != nil {
		t.Fatal(err)
	}
	var pgid, grandchild int
	testutil.Eventually(t, 10*time.Second, func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "stubborn.pids"))
		if err != nil {
			return false
		}
		_, err = fmt.Sscanf(string(b), "%d %d", &pgid, &grandchild)
		return err == nil
	}, "the agent wrote its pids")
	if !acpio.GroupAlive(pgid) {
		t.Fatalf("group %d not alive before dispose", pgid)
	}
	start := time.Now()
	st, err := run.Dispose(ctx)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if st.Result == nil || st.Result.StopReason != protocol.StopAborted || protocol.PlainText(st.Result.Output) != "partial" {
		t.Fatalf("dispose status %+v", st)
	}
	if took > 2*time.Second {
		t.Fatalf("dispose took %s: a non-cooperative agent must not delay settlement", took)
	}
	_, evs := s.Log(run.ChildID)
	if r := acpTurnEnd(t, evs); r.Kind != protocol.TurnAborted || r.Cause != protocol.CauseDisposed {
		t.Fatalf("turn/end %+v", r)
	}
	// EOF grace + SIGTERM grace + SIGKILL, with margin.
	testutil.Eventually(t, 5*time.Second, func() bool { return !acpio.GroupAlive(pgid) }, "process group %d is gone", pgid)
	if pids, ok := acpio.GroupMembers(pgid); !ok || len(pids) > 0 {
		t.Fatalf("processes of group %d remain: %v (proc readable %v)", pgid, pids, ok)
	}
	if err := syscall.Kill(grandchild, 0); err == nil {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", grandchild)); !strings.Contains(string(b), ") Z ") {
			t.Fatalf("grandchild %d is still alive: %s", grandchild, b)
		}
	}
	t.Logf("dispose settled in %s; tree gone after %s", took, time.Since(start))
}

// TestACPChildCwdMustBeEnterable: a parent workspace that is not an
// enterable directory refuses the start before any agent is spawned.
func TestACPChildCwdMustBeEnterable(t *testing.T) {
	// The agent command notes each spawn before it becomes the fake agent.
	spawns := filepath.Join(t.TempDir(), "spawns")
	s := acpStack(t, acpTestOptions(t), acpbridge.AgentConfig{Name: "fake", Command: "/bin/sh",
		Args: []string{"-c", `echo spawned >> "$0"; exec "$1"`, spawns, fakeAgent(t)}})
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cwd := range []string{"/nonexistent/workspace", file} {
		root := s.Root(cwd)
		_, _, err := s.Run(root.Ref(), "fake", "echo x", protocol.StartOptions{})
		if protocol.CodeOf(err) != protocol.CodeInvalidArgument || !strings.Contains(err.Error(), "workspace") {
			t.Fatalf("cwd %s: err %v", cwd, err)
		}
		if b, err := os.ReadFile(spawns); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("cwd %s: an agent was spawned for a refused start (%q, %v)", cwd, b, err)
		}
	}
	// The same agent command does spawn for an enterable workspace (the
	// check above can fail).
	_, res, err := s.Run(s.Root(t.TempDir()).Ref(), "fake", "echo x", protocol.StartOptions{})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("a start in an enterable workspace: %+v, %v", res, err)
	}
	if b, err := os.ReadFile(spawns); err != nil || !strings.Contains(string(b), "spawned") {
		t.Fatalf("the agent command did not note its spawn: %q, %v", b, err)
	}
}

// TestACPBridgeToBroodACPAgent: the bridge drives `brood acp-agent` (the
// `acp` provider of `brood dev`). The hop keeps the lineage: the agent's own
// session is at the child's depth under the same parent. A dispose reaches
// through: the agent's turn ends aborted too, and the agent exits at EOF.
func TestACPBridgeToBroodACPAgent(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	ps, err := acpbridge.Providers([]acpbridge.AgentConfig{{Name: "acp", Command: broodBin, Args: []string{"acp-agent", "--nats", s.Server.ClientURL()}}},
		acpbridge.Options{SilenceTimeout: 10 * time.Second, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	s.AddHost(ps...)
	root := s.Root()
	ids, res, took := runFor(t, s, root.Ref(), "acp", "say hi", 30*time.Second)
	if res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != "hi" {
		t.Fatalf("result %+v", res)
	}
	t.Logf("say hi through ACP: %s", took)
	_, evs := s.Log(ids[1])
	sess, ok := acpbridge.LastACPSession(evs)
	if !ok || !sess.LoadSession || sess.Agent != "brood 0.1.0" {
		t.Fatalf("acp/session %+v in %s", sess, eventTypes(evs))
	}
	h, inner := s.Log(sess.SessionID)
	if h.ParentSession != root.SessionID || h.DelegationDepth != 1 || h.Origin != protocol.OriginReopenable {
		t.Fatalf("the ACP agent's session header %+v", h)
	}
	if acpTurnEnd(t, inner).Kind != protocol.TurnCompleted {
		t.Fatalf("the ACP agent's log %s", eventTypes(inner))
	}
	// A prompt from the user (a client's root) is the user's in the agent's
	// own log; one relayed from a parent (its followup) keeps that source
	// through the bridge.
	if src := firstUserSource(t, inner); src.Kind != protocol.SourceUser {
		t.Fatalf("the ACP agent logged the user's prompt as %+v", src)
	}
	cont, err := s.Client.StartContinuable(context.Background(), protocol.ContinuableStartRequest{
		Provider: "acp", Parent: root.Ref(), Label: "relay", Prompt: protocol.Text("say first"),
	})
	if err != nil {
		t.Fatal(err)
	}
	followup(t, s, cont.ChildID, ref(root), "say relayed")
	testutil.Eventually(t, 20*time.Second, func() bool {
		_, evs := s.Log(cont.ChildID)
		d, ok := acpbridge.LastACPSession(evs)
		if !ok {
			return false
		}
		_, inner := s.Log(d.SessionID)
		var last protocol.UserMessageData
		for _, ev := range inner {
			if ev.Type == protocol.EvUserMessage {
				_ = ev.Decode(&last)
			}
		}
		return protocol.AllText(last.Content) == "say relayed" && last.Source.Kind == protocol.SourceCoordinator &&
			last.Source.SenderSessionID == root.SessionID
	}, "the relayed followup is logged in the ACP agent's session with its source")
	// A failing turn is the child's error with the agent's reason; the
	// note the agent streams for editors is no part of the answer.
	ids, res, _ = runFor(t, s, root.Ref(), "acp", "fail boom", 30*time.Second)
	if res.StopReason != protocol.StopError || !strings.Contains(res.Diagnostic, "boom") || strings.Contains(protocol.PlainText(res.Output), "turn failed") {
		t.Fatalf("a failing turn through the bridge: %+v", res)
	}
	_ = ids

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "acp", Prompt: protocol.Text("sleep 30s\nsay late"), Options: protocol.StartOptions{}})
	if err != nil {
		t.Fatal(err)
	}
	var inner2 string
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, evs := s.Log(run.ChildID)
		d, ok := acpbridge.LastACPSession(evs)
		inner2 = d.SessionID
		return ok
	}, "the ACP session is open")
	st, err := run.Dispose(ctx)
	if err != nil || st.Result == nil || st.Result.StopReason != protocol.StopAborted {
		t.Fatalf("dispose %+v %v", st, err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, evs := s.Log(inner2)
		return len(evs) > 0 && evs[len(evs)-1].Type == protocol.EvTurnEnd && acpTurnEnd(t, evs).Kind == protocol.TurnAborted
	}, "the ACP agent's own turn ended aborted")
}

// TestDevACPProvider is the demo: `brood dev` serves a default `acp`
// provider (this binary's own ACP agent), and `brood run --provider acp
// "say hi"` prints the agent's answer.
func TestDevACPProvider(t *testing.T) {
	url := startDev(t).natsURL
	var (
		out    []byte
		err    error
		stderr bytes.Buffer
	)
	// The last failure is reported as it stands when the wait gives up, not
	// as it was when the wait began.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		stderr.Reset()
		run := exec.Command(broodBin, "run", "--nats", url, "--provider", "acp", "say hi")
		run.Dir, run.Stderr = t.TempDir(), &stderr
		if out, err = run.Output(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("brood run --provider acp did not succeed within 20 s; last: %v, stderr %q", err, stderr.String())
		}
	}
	if string(out) != "hi\n" {
		t.Fatalf("brood run printed %q", out)
	}
	// `brood result` of the ACP run's child (its run id differs: "child C
	// (run R)") prints the same answer, as it does for the run's own id
	// (issue 37, item 8: it failed recommending that same command).
	f := strings.Fields(stderr.String())
	if len(f) < 4 || f[0] != "child" || f[2] != "(run" {
		t.Fatalf("brood run's stderr %q names no child and run", stderr.String())
	}
	for _, id := range []string{f[1], strings.TrimSuffix(f[3], ")")} {
		res := exec.Command(broodBin, "result", id, "--nats", url)
		var rerr bytes.Buffer
		res.Stderr = &rerr
		if out, err := res.Output(); err != nil || string(out) != "hi\n" {
			t.Fatalf("brood result %s: %q, %v\nstderr: %s", id, out, err, rerr.String())
		}
	}
}
