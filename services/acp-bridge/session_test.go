package acpbridge

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/provider"
)

// memLog is an in-memory session log.
type memLog struct {
	mu  sync.Mutex
	evs []protocol.SessionEvent
}

func (l *memLog) Append(_ context.Context, evs ...protocol.SessionEvent) ([]protocol.SessionEvent, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]protocol.SessionEvent, len(evs))
	for i, ev := range evs {
		ev.Seq = int64(len(l.evs))
		l.evs = append(l.evs, ev)
		out[i] = ev
	}
	return out, nil
}

func (l *memLog) events() []protocol.SessionEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]protocol.SessionEvent(nil), l.evs...)
}

var (
	fakeOnce sync.Once
	fakeBin  string
	fakeErr  error
)

func fakeAgent(t *testing.T) string {
	t.Helper()
	fakeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "acpfake-")
		if err != nil {
			fakeErr = err
			return
		}
		fakeBin = filepath.Join(dir, "acpfake")
		out, err := exec.Command("go", "build", "-o", fakeBin, "../../integration/acpfake").CombinedOutput()
		if err != nil {
			fakeErr = errors.New(string(out))
		}
	})
	if fakeErr != nil {
		t.Fatalf("build the fake ACP agent: %v", fakeErr)
	}
	return fakeBin
}

func tsAgent(t *testing.T) string {
	t.Helper()
	script, _ := filepath.Abs("../../integration/testdata/acp/ts-agent.mjs")
	sdk, _ := filepath.Abs("../../integration/testdata/acp/node_modules/@agentclientprotocol/sdk/package.json")
	if _, err := os.Stat(sdk); err != nil {
		t.Fatalf("%s is missing: run `make acp-deps`", sdk)
	}
	return script
}

func testOptions(t *testing.T) Options {
	return Options{SilenceTimeout: 5 * time.Second, EOFGrace: 300 * time.Millisecond, TermGrace: 300 * time.Millisecond, Logger: testutil.Logger(t)}
}

// turn runs one turn of sess and returns how it ended and the turn's output.
func turn(t *testing.T, sess provider.Session, log *memLog, prompt string) (protocol.TurnEndReason, string) {
	t.Helper()
	ctx := context.Background()
	before := len(log.events())
	if out, ok := sess.OpenTurn(ctx, provider.Input{Content: protocol.Text(prompt), Source: protocol.MessageSource{Kind: protocol.SourceUser}}); !ok {
		t.Fatalf("open turn: %+v", out)
	}
	out := sess.RunSteps(ctx)
	if out.Fenced || out.Err != nil {
		t.Fatalf("turn: %+v", out)
	}
	return out.Reason, protocol.PlainText(sessionlog.SelectOutput(log.events()[before:]))
}

func acpSessions(evs []protocol.SessionEvent) []protocol.ACPSessionData {
	var out []protocol.ACPSessionData
	for _, e := range evs {
		var d protocol.ACPSessionData
		if e.Type == protocol.EvACPSession && e.Decode(&d) == nil {
			out = append(out, d)
		}
	}
	return out
}

// TestSessionFollowupAndColdResume is how continuable ACP children plug in
// (issue point 3): later turns on a resident Session prompt the same ACP
// session; a Session built over the log after its process ended loads the
// recorded ACP session (the agent advertised session/load) and goes on.
func TestSessionFollowupAndColdResume(t *testing.T) {
	script := tsAgent(t)
	o := testOptions(t)
	o.Metrics = telemetry.NewMetrics("test")
	p, err := NewProvider(AgentConfig{Name: "ts", Command: "node", Args: []string{script},
		Env: map[string]string{"TS_AGENT_STATE_DIR": t.TempDir()}}, o)
	if err != nil {
		t.Fatal(err)
	}
	h := protocol.SessionHeader{ID: "child-1", Cwd: t.TempDir(), ParentSession: "parent-1", DelegationDepth: 1}
	log := &memLog{}
	s1, err := p.NewSession(context.Background(), provider.SessionSpec{Header: h, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if r, out := turn(t, s1, log, "hello"); r.Kind != protocol.TurnCompleted || out != "ts: hello" {
		t.Fatalf("turn 1: %+v %q", r, out)
	}
	if r, out := turn(t, s1, log, "turns"); r.Kind != protocol.TurnCompleted || out != "turns before this one: 1" {
		t.Fatalf("followup on the resident session: %+v %q", r, out)
	}
	acpMetrics(t, o.Metrics, 1, 1, 0) // one process served both turns
	_ = s1.(provider.Closer).Close()
	acpMetrics(t, o.Metrics, 0, 1, 1)

	s2, err := p.NewSession(context.Background(), provider.SessionSpec{Header: h, Log: log, Events: log.events()})
	if err != nil {
		t.Fatal(err)
	}
	if r, out := turn(t, s2, log, "turns"); r.Kind != protocol.TurnCompleted || out != "turns before this one: 2" {
		t.Fatalf("after a cold resume: %+v %q", r, out)
	}
	_ = s2.(provider.Closer).Close()
	acpMetrics(t, o.Metrics, 0, 2, 2)
	sessions := acpSessions(log.events())
	if len(sessions) != 2 || sessions[0].SessionID != sessions[1].SessionID || sessions[0].Loaded || !sessions[1].Loaded || !sessions[0].LoadSession {
		t.Fatalf("acp/session events %+v", sessions)
	}
	var turns []int64
	for _, e := range log.events() {
		var d protocol.TurnData
		if e.Type == protocol.EvTurnStart && e.Decode(&d) == nil {
			turns = append(turns, d.Turn)
		}
	}
	if len(turns) != 3 || turns[2] != 3 {
		t.Fatalf("turns %v", turns)
	}
}

// acpMetrics waits until the ACP process metrics of provider ts are live,
// started and exited.
func acpMetrics(t *testing.T, m *telemetry.Metrics, live, started, exited float64) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, func() bool {
		f, err := m.Gather()
		if err != nil {
			return false
		}
		l, _ := f.Sum("brood_acp_agent_processes", "provider", "ts")
		s, _ := f.Sum("brood_acp_agent_processes_started_total", "provider", "ts")
		e, _ := f.Sum("brood_acp_agent_processes_exited_total", "provider", "ts")
		return l == live && s == started && e == exited
	}, "ACP processes: %v live, %v started, %v exited", live, started, exited)
}

// An agent whose command cannot be started ends the turn error, counted.
func TestSessionStartFailureIsCounted(t *testing.T) {
	o := testOptions(t)
	o.Metrics = telemetry.NewMetrics("test")
	p, err := NewProvider(AgentConfig{Name: "ts", Command: filepath.Join(t.TempDir(), "no-such-agent")}, o)
	if err != nil {
		t.Fatal(err)
	}
	log := &memLog{}
	s, err := p.NewSession(context.Background(), provider.SessionSpec{Header: protocol.SessionHeader{ID: "child-1", Cwd: t.TempDir(), ParentSession: "p"}, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer s.(provider.Closer).Close()
	if r, _ := turn(t, s, log, "hello"); r.Kind != protocol.TurnError || !strings.Contains(r.Error, "could not start the ACP agent") {
		t.Fatalf("turn: %+v", r)
	}
	f, err := o.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := f.Sum("brood_acp_agent_process_start_failures_total", "provider", "ts"); n != 1 {
		t.Fatalf("start failures = %v, want 1", n)
	}
	if n, _ := f.Sum("brood_acp_agent_processes_started_total"); n != 0 {
		t.Fatalf("started = %v, want 0", n)
	}
}

// An agent that did not advertise session/load cannot be resumed.
func TestSessionWithoutLoadIsNotResumable(t *testing.T) {
	p, err := NewProvider(AgentConfig{Name: "fake", Command: fakeAgent(t)}, testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	h := protocol.SessionHeader{ID: "child-2", Cwd: t.TempDir()}
	log := &memLog{}
	s1, _ := p.NewSession(context.Background(), provider.SessionSpec{Header: h, Log: log})
	if r, out := turn(t, s1, log, "echo one"); r.Kind != protocol.TurnCompleted || out != "echo: one" {
		t.Fatalf("turn: %+v %q", r, out)
	}
	_ = s1.(provider.Closer).Close()
	_, err = p.NewSession(context.Background(), provider.SessionSpec{Header: h, Log: log, Events: log.events()})
	if !errors.Is(err, protocol.ErrNotResumable) || !strings.Contains(err.Error(), "did not advertise session/load") {
		t.Fatalf("err %v", err)
	}
}

// A child whose tool ceiling denies any tool has every permission request
// rejected, whatever its provider's policy (fail closed).
func TestSessionCeilingRejectsPermissions(t *testing.T) {
	p, err := NewProvider(AgentConfig{Name: "fake", Command: fakeAgent(t), Permission: PolicyAllow}, testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		ceiling *protocol.ToolFilter
		want    string
	}{
		{nil, "selected yes"},
		{&protocol.ToolFilter{Deny: []string{"read_file"}}, "selected no"},
		{&protocol.ToolFilter{Allow: []string{"list_dir", "read_file", "subagent"}}, "selected no"},
	} {
		log := &memLog{}
		s, _ := p.NewSession(context.Background(), provider.SessionSpec{Header: protocol.SessionHeader{ID: "c", Cwd: t.TempDir(), ToolCeiling: tt.ceiling}, Log: log})
		r, out := turn(t, s, log, "permission")
		_ = s.(provider.Closer).Close()
		if r.Kind != protocol.TurnCompleted || out != tt.want {
			t.Errorf("ceiling %+v: %+v %q, want %q", tt.ceiling, r, out, tt.want)
		}
		perms := permissions(t, log.events())
		if len(perms) != 1 || perms[0].Granted != (tt.ceiling == nil) ||
			(tt.ceiling != nil && perms[0].Why != "the child's tool ceiling denies tools") {
			t.Errorf("ceiling %+v: acp/permission %+v", tt.ceiling, perms)
		}
	}
}

func permissions(t *testing.T, evs []protocol.SessionEvent) []protocol.ACPPermissionData {
	t.Helper()
	var out []protocol.ACPPermissionData
	for _, ev := range evs {
		if ev.Type == protocol.EvACPPermission {
			var d protocol.ACPPermissionData
			if err := ev.Decode(&d); err != nil {
				t.Fatal(err)
			}
			out = append(out, d)
		}
	}
	return out
}

// TestSessionPermissionsAreLoggedAndCounted is issue 14, item 5: under the
// reject policy the agent's reject option is selected when it offers one
// (the `cancelled` outcome only when it offers none), and every request and
// its answer is in the child's log and counted in its result.
func TestSessionPermissionsAreLoggedAndCounted(t *testing.T) {
	tests := []struct {
		policy      Policy
		prompt      string
		out         string
		outcome     string
		option      string
		granted     bool
		counts      protocol.PermissionCounts
		optionKinds string
	}{
		{PolicyReject, "permission", "selected no", "selected", "no", false, protocol.PermissionCounts{Requested: 1, Denied: 1}, "reject_once allow_once"},
		{PolicyReject, "permission-allow-only", "cancelled", "cancelled", "", false, protocol.PermissionCounts{Requested: 1, Denied: 1}, "allow_once"},
		{PolicyAllow, "permission", "selected yes", "selected", "yes", true, protocol.PermissionCounts{Requested: 1, Granted: 1}, "reject_once allow_once"},
	}
	for _, tt := range tests {
		t.Run(string(tt.policy)+" "+tt.prompt, func(t *testing.T) {
			p, err := NewProvider(AgentConfig{Name: "fake", Command: fakeAgent(t), Permission: tt.policy}, testOptions(t))
			if err != nil {
				t.Fatal(err)
			}
			log := &memLog{}
			s, _ := p.NewSession(context.Background(), provider.SessionSpec{Header: protocol.SessionHeader{ID: "c", Cwd: t.TempDir()}, Log: log})
			r, out := turn(t, s, log, tt.prompt)
			_ = s.(provider.Closer).Close()
			if r.Kind != protocol.TurnCompleted || out != tt.out {
				t.Fatalf("turn %+v %q, want %q", r, out, tt.out)
			}
			perms := permissions(t, log.events())
			if len(perms) != 1 {
				t.Fatalf("%d acp/permission events", len(perms))
			}
			d := perms[0]
			var kinds []string
			for _, o := range d.Options {
				kinds = append(kinds, o.Kind)
			}
			if d.Turn != 1 || d.Step != 1 || d.Late || d.ToolCallID != "p1" || d.Title != "Write a file" || d.Policy != string(tt.policy) ||
				d.Outcome != tt.outcome || d.OptionID != tt.option || d.Granted != tt.granted || strings.Join(kinds, " ") != tt.optionKinds {
				t.Fatalf("acp/permission %+v", d)
			}
			res := sessionlog.OneShotOutcome(log.events(), false, false)
			if res.Permissions == nil || *res.Permissions != tt.counts {
				t.Fatalf("result permissions %+v, want %+v", res.Permissions, tt.counts)
			}
		})
	}
}

// TestSessionLateUpdates is issue 14, item 6: updates that trail the answer
// to session/prompt within the quiet period count for the turn; later ones
// are logged against the sealed turn (acp/late-update, and a permission
// request then is rejected and logged late), never credited to the next turn.
func TestSessionLateUpdates(t *testing.T) {
	o := testOptions(t)
	o.SealQuiet, o.SealWaitMax = 300*time.Millisecond, 600*time.Millisecond
	p, err := NewProvider(AgentConfig{Name: "fake", Command: fakeAgent(t), Permission: PolicyAllow}, o)
	if err != nil {
		t.Fatal(err)
	}
	log := &memLog{}
	s, _ := p.NewSession(context.Background(), provider.SessionSpec{Header: protocol.SessionHeader{ID: "c", Cwd: t.TempDir()}, Log: log})
	defer s.(provider.Closer).Close()
	if r, out := turn(t, s, log, "trailing 20ms"); r.Kind != protocol.TurnCompleted || out != "main trailing" {
		t.Fatalf("turn 1: %+v %q, want the trailing chunk in the output", r, out)
	}
	if r, out := turn(t, s, log, "late 1500ms"); r.Kind != protocol.TurnCompleted || out != "main" {
		t.Fatalf("turn 2: %+v %q", r, out)
	}
	var late []protocol.ACPLateUpdateData
	testutil.Eventually(t, 10*time.Second, func() bool {
		late = late[:0]
		for _, ev := range log.events() {
			var d protocol.ACPLateUpdateData
			if ev.Type == protocol.EvACPLateUpdate && ev.Decode(&d) == nil {
				late = append(late, d)
			}
		}
		return len(late) == 2 && len(permissions(t, log.events())) == 1
	}, "the late output of turn 2 was logged")
	if late[0].Turn != 2 || late[0].Kind != "agent_message_chunk" || late[0].Text != " late" ||
		late[1].Turn != 2 || late[1].Kind != "tool_call" || late[1].ToolCallID != "late-tool" {
		t.Fatalf("late updates %+v", late)
	}
	if perm := permissions(t, log.events())[0]; perm.Turn != 2 || !perm.Late || perm.Granted || perm.OptionID != "no" {
		t.Fatalf("late permission %+v (rejected whatever the policy: the turn is over)", perm)
	}
	before := len(log.events())
	if r, out := turn(t, s, log, "echo three"); r.Kind != protocol.TurnCompleted || out != "echo: three" {
		t.Fatalf("turn 3: %+v %q", r, out)
	}
	for _, ev := range log.events()[before:] {
		if ev.Type == protocol.EvACPLateUpdate || ev.Type == protocol.EvACPPermission || ev.Type == protocol.EvToolCall {
			t.Fatalf("turn 3 got %s: late output reached the next turn", ev.Type)
		}
	}
	if err := sessionlog.ValidateReplay(log.events(), false); err != nil {
		t.Fatalf("the log does not replay: %v", err)
	}
}

func TestAgentConfig(t *testing.T) {
	dir := t.TempDir()
	a, err := ParseAgentSpec("name=codex,command=npx,arg=-y,arg=@zed-industries/codex-acp,env=HOME=/srv/x,env=A=b=c,env=OPENAI_API_KEY,cwd=" + dir + ",permission=allow")
	if err != nil {
		t.Fatal(err)
	}
	// A bare env=NAME passes the bridge's own variable through (issue 29, item 6).
	if a.Name != "codex" || a.Command != "npx" || strings.Join(a.Args, " ") != "-y @zed-industries/codex-acp" ||
		a.Env["HOME"] != "/srv/x" || a.Env["A"] != "b=c" || strings.Join(a.PassEnv, " ") != "OPENAI_API_KEY" || a.Cwd != dir || a.Permission != PolicyAllow {
		t.Fatalf("%+v", a)
	}
	for spec, want := range map[string]string{
		"name=x":                             "command is required",
		"name=bad name,command=c":            "must match",
		"name=x,command=c,permission=maybe":  "reject, allow or ask",
		"name=x,command=c,cwd=relative":      "not an absolute path",
		"name=x,command=c,cwd=/nonexistent/": "no such file",
		"name=x,command=c,colour=red":        "unknown key",
		"name=x,command=c,env=":              "passEnv name",
		"name=x,command=c,env==v":            "env name",
	} {
		if _, err := ParseAgentSpec(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err %v, want %q", spec, err, want)
		}
	}
	// The three policies, reject the default (issue 33, item 2c).
	for spec, want := range map[string]Policy{"name=x,command=c": PolicyReject, "name=x,command=c,permission=allow": PolicyAllow,
		"name=x,command=c,permission=ask": PolicyAsk} {
		if a, err := ParseAgentSpec(spec); err != nil || a.Permission != want {
			t.Errorf("%s: permission %q, %v; want %q", spec, a.Permission, err, want)
		}
	}
	file := filepath.Join(dir, "bridge.json")
	_ = os.WriteFile(file, []byte(`{"agents":[{"name":"a","command":"c"},{"name":"b","command":"c","permission":"ask"}],"silenceTimeout":"5s","eofGrace":"1s"}`), 0o600)
	f, err := LoadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var o Options
	f.Apply(&o)
	if len(f.Agents) != 2 || f.Agents[0].Permission != PolicyReject || f.Agents[1].Permission != PolicyAsk || o.SilenceTimeout != 5*time.Second || o.EOFGrace != time.Second || o.TermGrace != 0 {
		t.Fatalf("file %+v options %+v", f, o)
	}
	_ = os.WriteFile(file, []byte(`{"agents":[],"silenceTimout":"5s"}`), 0o600)
	if _, err := LoadFile(file); err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Fatalf("a misspelt field: %v", err)
	}
}

// failingLog accepts the first n appends, then fails every later one with err.
type failingLog struct {
	memLog
	n   int
	err error
}

func (l *failingLog) Append(ctx context.Context, evs ...protocol.SessionEvent) ([]protocol.SessionEvent, error) {
	l.mu.Lock()
	l.n--
	fail := l.n < 0
	l.mu.Unlock()
	if fail {
		return nil, l.err
	}
	return l.memLog.Append(ctx, evs...)
}

// A session that lost its log (fenced) or its lease stops and appends
// nothing more; a log that does not acknowledge is DURABILITY_FAILED.
func TestSessionStopsWhenItLosesTheLog(t *testing.T) {
	p, err := NewProvider(AgentConfig{Name: "fake", Command: fakeAgent(t)}, testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	open := func(log provider.Appender) provider.Session {
		s, err := p.NewSession(context.Background(), provider.SessionSpec{Header: protocol.SessionHeader{ID: "c", Cwd: t.TempDir()}, Log: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.(provider.Closer).Close() })
		if out, ok := s.OpenTurn(context.Background(), provider.Input{Content: protocol.Text("slow 2s")}); !ok {
			t.Fatalf("open: %+v", out)
		}
		return s
	}

	fenced := &failingLog{n: 1, err: provider.ErrFenced}
	if out := open(fenced).RunSteps(context.Background()); !out.Fenced {
		t.Fatalf("fenced log: %+v", out)
	}
	if got := strings.Join(typesOf(fenced.events()), " "); got != "turn/start user/message" {
		t.Fatalf("log after the fence: %s (want the opening only)", got)
	}

	unacked := &failingLog{n: 1, err: errors.New("no JetStream acknowledgement")}
	if out := open(unacked).RunSteps(context.Background()); out.Err == nil || out.Fenced {
		t.Fatalf("unacknowledged log: %+v", out)
	}

	log := &memLog{}
	s := open(log)
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		for s.(*Session).ACPSessionID() == "" {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
		cancel(provider.ErrLeaseLost)
	}()
	start := time.Now()
	out := s.RunSteps(ctx)
	if !out.Fenced || time.Since(start) > time.Second {
		t.Fatalf("lease lost: %+v after %s", out, time.Since(start))
	}
	if got := strings.Join(typesOf(log.events()), " "); got != "turn/start user/message acp/session step/start" {
		t.Fatalf("log after the lease was lost: %s", got)
	}
}

func typesOf(evs []protocol.SessionEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

// TestSessionUsage: a turn's usage is what the agent reported with its
// answer (ACP's PromptResponse.usage), on the turn's assistant message; an
// agent that reports none leaves the turn's usage unknown, never zero, and
// the log's fold counts it as an unreported request (docs/protocol.md §6.6).
func TestSessionUsage(t *testing.T) {
	p, err := NewProvider(AgentConfig{Name: "fake", Command: fakeAgent(t)}, testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	log := &memLog{}
	s, _ := p.NewSession(context.Background(), provider.SessionSpec{Header: protocol.SessionHeader{ID: "c", Cwd: t.TempDir()}, Log: log})
	defer s.(provider.Closer).Close()
	tests := []struct {
		prompt string
		want   protocol.Usage
	}{
		{"echo hi", protocol.Usage{Unknown: true}},
		{"usage 7 3", protocol.Usage{InputTokens: 7, OutputTokens: 3}},
		{"usage-quiet 5 2", protocol.Usage{InputTokens: 5, OutputTokens: 2}},
		{"refuse", protocol.Usage{Unknown: true}},
	}
	for _, tt := range tests {
		before := len(log.events())
		turn(t, s, log, tt.prompt)
		var got []protocol.AssistantMessageData
		for _, ev := range log.events()[before:] {
			var d protocol.AssistantMessageData
			if ev.Type == protocol.EvAssistantMessage && ev.Decode(&d) == nil {
				got = append(got, d)
			}
		}
		if len(got) != 1 || got[0].Usage == nil || *got[0].Usage != tt.want {
			t.Errorf("%q: assistant messages %+v, want one with usage %+v", tt.prompt, got, tt.want)
		}
	}
	u := sessionlog.OwnUsage(log.events())
	if u.ModelRequests != 4 || u.UnreportedRequests != 2 || u.InputTokens != 12 || u.OutputTokens != 5 {
		t.Fatalf("own usage %+v: want 4 requests, 2 unreported, 12 in, 5 out", u)
	}
	if err := sessionlog.ValidateReplay(log.events(), false); err != nil {
		t.Fatalf("the log does not replay: %v", err)
	}
}
