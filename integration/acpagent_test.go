package integration

import (
	"context"
	"io"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// recorder is an ACP client (the ACP Go SDK's client side) that records
// every session/update it gets.
type recorder struct {
	mu      sync.Mutex
	updates []acp.SessionUpdate
}

func (r *recorder) SessionUpdate(_ context.Context, n acp.SessionNotification) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.updates = append(r.updates, n.Update)
	return nil
}

// take returns the updates so far, rendered one per line, and forgets them.
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, u := range r.updates {
		switch {
		case u.UserMessageChunk != nil && u.UserMessageChunk.Content.Text != nil:
			out = append(out, "user: "+u.UserMessageChunk.Content.Text.Text)
		case u.AgentMessageChunk != nil && u.AgentMessageChunk.Content.Text != nil:
			out = append(out, "agent: "+u.AgentMessageChunk.Content.Text.Text)
		case u.ToolCall != nil:
			out = append(out, "tool_call "+u.ToolCall.Title)
		case u.ToolCallUpdate != nil && u.ToolCallUpdate.Status != nil:
			out = append(out, "tool_call_update "+string(*u.ToolCallUpdate.Status))
		}
	}
	r.updates = nil
	return out
}

func (r *recorder) RequestPermission(context.Context, acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	return acp.RequestPermissionResponse{Outcome: acp.RequestPermissionOutcome{Cancelled: &acp.RequestPermissionOutcomeCancelled{}}}, nil
}
func (r *recorder) ReadTextFile(context.Context, acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	return acp.ReadTextFileResponse{}, acp.NewMethodNotFound(acp.ClientMethodFsReadTextFile)
}
func (r *recorder) WriteTextFile(context.Context, acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	return acp.WriteTextFileResponse{}, acp.NewMethodNotFound(acp.ClientMethodFsWriteTextFile)
}
func (r *recorder) CreateTerminal(context.Context, acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error) {
	return acp.CreateTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalCreate)
}
func (r *recorder) KillTerminal(context.Context, acp.KillTerminalRequest) (acp.KillTerminalResponse, error) {
	return acp.KillTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalKill)
}
func (r *recorder) TerminalOutput(context.Context, acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error) {
	return acp.TerminalOutputResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalOutput)
}
func (r *recorder) ReleaseTerminal(context.Context, acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	return acp.ReleaseTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalRelease)
}
func (r *recorder) WaitForTerminalExit(context.Context, acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error) {
	return acp.WaitForTerminalExitResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalWaitForExit)
}

// acpAgentProc is a `brood acp-agent` process driven by the SDK's client side.
type acpAgentProc struct {
	conn  *acp.ClientSideConnection
	rec   *recorder
	stdin io.WriteCloser
	p     *proc
}

func startACPAgent(t *testing.T, url string) *acpAgentProc {
	t.Helper()
	cmd := exec.Command(broodBin, "acp-agent", "--nats", url, "--log-level", "info")
	p := &proc{cmd: cmd, done: make(chan struct{})}
	cmd.Stderr = lockedWriter{p}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("stderr of acp-agent:\n%s", p.Stderr())
		}
	})
	rec := &recorder{}
	conn := acp.NewClientSideConnection(rec, stdin, stdout)
	conn.SetLogger(testutil.Logger(t))
	return &acpAgentProc{conn: conn, rec: rec, stdin: stdin, p: p}
}

// exit closes the agent's stdin and waits for it to exit by itself.
func (a *acpAgentProc) exit(t *testing.T) {
	t.Helper()
	_ = a.stdin.Close()
	select {
	case <-a.p.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("acp-agent did not exit at EOF:\n%s", a.p.Stderr())
	}
}

// TestACPAgentOverACP drives `brood acp-agent` with the ACP Go SDK's client
// side: initialize, session/new with a lineage in _meta, prompts with
// streamed chunks and tool calls; then a new process loads the session and
// replays its history, and the session goes on.
func TestACPAgentOverACP(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	parent := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()

	a := startACPAgent(t, s.Server.ClientURL())
	init, err := a.conn.Initialize(ctx, acp.InitializeRequest{ProtocolVersion: acp.ProtocolVersionNumber})
	if err != nil {
		t.Fatal(err)
	}
	if !init.AgentCapabilities.LoadSession || init.AgentInfo == nil || init.AgentInfo.Name != "brood" {
		t.Fatalf("initialize %+v", init)
	}
	depthCap := int64(2)
	lineage := protocol.ACPLineage{ParentSession: parent.SessionID, DelegationDepth: 0, DepthCap: &depthCap,
		ToolCeiling: &protocol.ToolFilter{Deny: []string{"list_dir"}}}
	ns, err := a.conn.NewSession(ctx, acp.NewSessionRequest{Cwd: dir, McpServers: []acp.McpServer{}, Meta: lineage.Meta()})
	if err != nil {
		t.Fatal(err)
	}
	id := string(ns.SessionId)

	// The root honours the lineage, narrowed by the coordinator: a claimed
	// depth 0 under a depth-0 parent is depth 1; cap and ceiling are kept.
	h, _ := s.Log(id)
	if h.ParentSession != parent.SessionID || h.DelegationDepth != 1 || h.DepthCap == nil || *h.DepthCap != 2 ||
		h.ToolCeiling == nil || strings.Join(h.ToolCeiling.Deny, ",") != "list_dir" || h.Origin != protocol.OriginReopenable || h.Cwd != dir {
		t.Fatalf("header %+v", h)
	}

	prompt := func(a *acpAgentProc, text string) acp.StopReason {
		t.Helper()
		r, err := a.conn.Prompt(ctx, acp.PromptRequest{SessionId: ns.SessionId, Prompt: []acp.ContentBlock{acp.TextBlock(text)}})
		if err != nil {
			t.Fatalf("prompt %q: %v", text, err)
		}
		return r.StopReason
	}
	if stop := prompt(a, "say hi"); stop != acp.StopReasonEndTurn {
		t.Fatalf("stop reason %s", stop)
	}
	if got := strings.Join(a.rec.take(), "|"); got != "agent: hi" {
		t.Fatalf("updates %s", got)
	}
	// The ceiling denies list_dir: the agent does not have it.
	if stop := prompt(a, "call list_dir {}\nsay after"); stop != acp.StopReasonEndTurn {
		t.Fatalf("stop reason %s", stop)
	}
	if got, want := strings.Join(a.rec.take(), "|"), "tool_call list_dir|tool_call_update failed|agent: after"; got != want {
		t.Fatalf("updates %s\nwant %s", got, want)
	}
	a.exit(t)

	b := startACPAgent(t, s.Server.ClientURL())
	if _, err := b.conn.Initialize(ctx, acp.InitializeRequest{ProtocolVersion: acp.ProtocolVersionNumber}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.conn.LoadSession(ctx, acp.LoadSessionRequest{SessionId: ns.SessionId, Cwd: dir, McpServers: []acp.McpServer{}}); err != nil {
		t.Fatal(err)
	}
	want := "user: say hi|agent: hi|user: call list_dir {}\nsay after|tool_call list_dir|tool_call_update failed|agent: after"
	if got := strings.Join(b.rec.take(), "|"); got != want {
		t.Fatalf("replay %q\nwant %q", got, want)
	}
	if stop := prompt(b, "say again"); stop != acp.StopReasonEndTurn {
		t.Fatalf("stop reason %s", stop)
	}
	if got := strings.Join(b.rec.take(), "|"); got != "agent: again" {
		t.Fatalf("updates %s", got)
	}
	_, evs := s.Log(id)
	if acpTurnEnd(t, evs).Kind != protocol.TurnCompleted || evs[len(evs)-1].Type != protocol.EvTurnEnd {
		t.Fatalf("log %s", eventTypes(evs))
	}
	var turns int
	for _, e := range evs {
		if e.Type == protocol.EvTurnStart {
			turns++
		}
	}
	if turns != 3 {
		t.Fatalf("%d turns in %s", turns, eventTypes(evs))
	}
	b.exit(t)
}

// TestACPAgentForEditors: what an editor sees from `brood acp-agent`. A turn
// that fails is a stop reason (end_turn, the reason in _meta and streamed as
// a marked note), not a JSON-RPC error; a subagent tool call's update carries
// the child's id; a prompt relayed by an agent is logged with its source.
func TestACPAgentForEditors(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a := startACPAgent(t, s.Server.ClientURL())
	if _, err := a.conn.Initialize(ctx, acp.InitializeRequest{ProtocolVersion: acp.ProtocolVersionNumber}); err != nil {
		t.Fatal(err)
	}
	ns, err := a.conn.NewSession(ctx, acp.NewSessionRequest{Cwd: t.TempDir(), McpServers: []acp.McpServer{}})
	if err != nil {
		t.Fatal(err)
	}

	r, err := a.conn.Prompt(ctx, acp.PromptRequest{SessionId: ns.SessionId, Prompt: []acp.ContentBlock{acp.TextBlock("fail boom")}})
	if err != nil {
		t.Fatalf("a failing turn answered a JSON-RPC error: %v", err)
	}
	var te struct{ TurnEnd protocol.ACPTurnEnd }
	if r.StopReason != acp.StopReasonEndTurn || !protocol.ACPMetaOf(r.Meta, &te) || te.TurnEnd.Kind != protocol.TurnError || !strings.Contains(te.TurnEnd.Error, "boom") {
		t.Fatalf("response %+v", r)
	}
	a.rec.mu.Lock()
	var noted bool
	for _, u := range a.rec.updates {
		if c := u.AgentMessageChunk; c != nil && c.Content.Text != nil && strings.Contains(c.Content.Text.Text, "boom") {
			var m struct{ Notice string }
			noted = protocol.ACPMetaOf(c.Meta, &m) && m.Notice == protocol.ACPNoticeTurnError
		}
	}
	a.rec.updates = nil
	a.rec.mu.Unlock()
	if !noted {
		t.Fatal("the editor was not shown why the turn failed")
	}

	r, err = a.conn.Prompt(ctx, acp.PromptRequest{SessionId: ns.SessionId, Prompt: []acp.ContentBlock{acp.TextBlock(
		"call subagent {\"description\":\"a child\",\"prompt\":\"say from the child\"}\nsay done")}})
	if err != nil || r.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("subagent prompt: %+v %v", r, err)
	}
	a.rec.mu.Lock()
	var child string
	for _, u := range a.rec.updates {
		if c := u.ToolCallUpdate; c != nil && c.Status != nil && *c.Status == acp.ToolCallStatusCompleted {
			var m struct{ ChildID string }
			if protocol.ACPMetaOf(c.Meta, &m) {
				child = m.ChildID
			}
			if out, ok := c.RawOutput.(map[string]any); !ok || out["childId"] != child {
				t.Errorf("rawOutput %v, want the child id %s", c.RawOutput, child)
			}
		}
	}
	a.rec.updates = nil
	a.rec.mu.Unlock()
	if child == "" {
		t.Fatal("the subagent tool-call update carries no child id")
	}
	if h, evs := s.Log(child); h.ParentSession != string(ns.SessionId) || acpTurnEnd(t, evs).Kind != protocol.TurnCompleted {
		t.Fatalf("the linked child %s: header %+v", child, h)
	}

	relay := protocol.MessageSource{Kind: protocol.SourceCoordinator, Form: "relay", SenderSessionID: "01PARENTAGENT0000000000000"}
	_, err = a.conn.Prompt(ctx, acp.PromptRequest{SessionId: ns.SessionId, Prompt: []acp.ContentBlock{acp.TextBlock("say relayed")},
		Meta: map[string]any{protocol.ACPMetaKey: protocol.ACPPromptMeta{Source: &relay}}})
	if err != nil {
		t.Fatal(err)
	}
	_, evs := s.Log(string(ns.SessionId))
	var last protocol.UserMessageData
	for _, ev := range evs {
		if ev.Type == protocol.EvUserMessage {
			_ = ev.Decode(&last)
		}
	}
	if last.Source != relay {
		t.Fatalf("the relayed prompt was logged with source %+v, want %+v", last.Source, relay)
	}
}

// TestACPAgentTakesBackgroundNoticesAsTurns: an ACP session of `brood
// acp-agent` starts background children (run_in_background). A child that
// settles while the agent is idle wakes it: the notice becomes a new turn
// without any prompt, and the editor sees it (the notice as the user's side,
// then the agent's answer). A child that settles while a turn runs joins that
// turn at its next step. The root's inbox is empty afterwards.
func TestACPAgentTakesBackgroundNoticesAsTurns(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	a := startACPAgent(t, s.Server.ClientURL())
	if _, err := a.conn.Initialize(ctx, acp.InitializeRequest{ProtocolVersion: acp.ProtocolVersionNumber}); err != nil {
		t.Fatal(err)
	}
	ns, err := a.conn.NewSession(ctx, acp.NewSessionRequest{Cwd: t.TempDir(), McpServers: []acp.McpServer{}})
	if err != nil {
		t.Fatal(err)
	}
	id := string(ns.SessionId)
	prompt := func(text string) {
		t.Helper()
		r, err := a.conn.Prompt(ctx, acp.PromptRequest{SessionId: ns.SessionId, Prompt: []acp.ContentBlock{acp.TextBlock(text)}})
		if err != nil || r.StopReason != acp.StopReasonEndTurn {
			t.Fatalf("prompt %q: %+v, %v", text, r, err)
		}
	}
	turns := func() []string {
		_, evs := s.Log(id)
		var kinds []string
		for _, ev := range evs {
			var d protocol.UserMessageData
			if ev.Type == protocol.EvUserMessage && ev.Decode(&d) == nil {
				kinds = append(kinds, d.Source.Kind)
			}
		}
		return kinds
	}

	// Idle: the child takes a moment, so the prompted turn has ended when
	// its notice arrives.
	prompt(`call subagent {"description":"slow job","prompt":"sleep 3s\nsay child result","run_in_background":true}` + "\nsay started")
	if got := strings.Join(a.rec.take(), "|"); got != "tool_call subagent|tool_call_update completed|agent: started" {
		t.Fatalf("updates of the prompted turn: %s", got)
	}
	var updates []string
	testutil.Eventually(t, 30*time.Second, func() bool {
		updates = append(updates, a.rec.take()...)
		joined := strings.Join(updates, "|")
		return strings.Contains(joined, "Closing message:\nchild result|agent: echo: Subagent")
	}, "the editor sees the notice and the agent's answer, unprompted")
	if !strings.HasPrefix(updates[0], "user: Subagent ") || !strings.Contains(updates[0], "is done and idle until you send it more.") {
		t.Fatalf("updates of the notice's turn: %q", updates)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		return strings.Join(turns(), ",") == "user,subagent-settled"
	}, "the log holds the notice as a turn of its own: %v", turns())
	_, evs := s.Log(id)
	if acpTurnEnd(t, evs).Kind != protocol.TurnCompleted || evs[len(evs)-1].Type != protocol.EvTurnEnd {
		t.Fatalf("log %s", eventTypes(evs))
	}
	var opening []string
	for i := len(evs) - 1; i >= 0 && evs[i].Type != protocol.EvTurnStart; i-- {
		opening = append([]string{evs[i].Type}, opening...)
	}
	if !strings.HasPrefix(strings.Join(opening, " "), "agent/inbox/enqueue agent/inbox/dequeue user/message step/start") {
		t.Fatalf("the notice's turn: %v", opening)
	}

	// Busy: a notice that arrives while a turn runs joins it at its next
	// step (the scripted model then answers the newest user message: the notice).
	// The turn goes on for up to 40 short steps; the notice joins the first
	// step that starts after it arrived, and the answer to it ends the turn.
	prompt(`call subagent {"description":"quick job","prompt":"say quick","run_in_background":true}` + "\n" +
		strings.Repeat("sleep 500ms\ncall list_dir {}\n", 40) + "say done")
	got := strings.Join(a.rec.take(), "|")
	if !strings.HasPrefix(got, "tool_call subagent|tool_call_update completed|") ||
		!strings.Contains(got, "|user: Subagent ") || !strings.HasSuffix(got, "Closing message:\nquick") ||
		!strings.Contains(got, "Closing message:\nquick|agent: echo: Subagent ") {
		t.Fatalf("updates of the busy turn: %s", got)
	}
	if k := strings.Join(turns(), ","); k != "user,subagent-settled,user,subagent-settled" {
		t.Fatalf("user messages %s", k)
	}
	_, evs = s.Log(id)
	starts := 0
	for _, ev := range evs {
		if ev.Type == protocol.EvTurnStart {
			starts++
		}
	}
	if starts != 3 {
		t.Fatalf("%d turns, want 3 (the second notice joined the running turn): %s", starts, eventTypes(evs))
	}
	if p, err := s.Client.Inbox(ctx, protocol.InboxReadRequest{SessionID: id, Authority: s.Grant()}); err != nil || len(p.Items) != 0 {
		t.Fatalf("the root's inbox afterwards: %+v, %v", p, err)
	}
	a.exit(t)
}
