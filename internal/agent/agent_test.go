package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// memLog is an in-memory Appender that records each record's events.
type memLog struct {
	mu      sync.Mutex
	records [][]protocol.SessionEvent
	next    int64
	fenced  bool
}

func (m *memLog) Append(_ context.Context, evs ...protocol.SessionEvent) ([]protocol.SessionEvent, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fenced {
		return nil, store.ErrFenced
	}
	out := make([]protocol.SessionEvent, len(evs))
	for i, ev := range evs {
		ev.Seq = m.next
		m.next++
		out[i] = ev
	}
	m.records = append(m.records, out)
	return out, nil
}

func (m *memLog) types() [][]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out [][]string
	for _, r := range m.records {
		var ts []string
		for _, ev := range r {
			ts = append(ts, ev.Type)
		}
		out = append(out, ts)
	}
	return out
}

func newTestAgent(t *testing.T, m model.Model, log *memLog, cwd string, tools ...*Tool) *Agent {
	t.Helper()
	if len(tools) == 0 {
		tools = []*Tool{ListDirTool(AnyWorkspace)}
	}
	reg, err := NewRegistry(tools...)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Header: protocol.SessionHeader{ID: "S1", Cwd: cwd}, Log: log, Model: m, Tools: reg})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func userInput(text string) Input {
	return Input{Content: protocol.Text(text), Source: protocol.MessageSource{Kind: protocol.SourceUser}}
}

func TestTurnRecordsOneRecordPerStep(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	log := &memLog{}
	a := newTestAgent(t, model.NewScripted(), log, dir)
	out := a.RunTurn(context.Background(), userInput("call list_dir {}\nsay done"))
	if out.Fenced || out.Err != nil || out.Reason.Kind != protocol.TurnCompleted {
		t.Fatalf("outcome = %+v", out)
	}
	want := [][]string{
		{"turn/start", "user/message"},
		{"step/start", "assistant/message", "tool/call"},
		{"tool/result", "step/end"},
		{"step/start", "assistant/message", "step/end", "turn/end"},
	}
	if got := log.types(); !equal2(got, want) {
		t.Fatalf("records = %v\nwant      %v", got, want)
	}
	evs := a.Events()
	var res protocol.ToolResultData
	if err := evs[5].Decode(&res); err != nil || res.IsError || protocol.PlainText(res.Content) != "a.txt" {
		t.Fatalf("list_dir result = %+v, %v", res, err)
	}
	r := sessionlog.OneShotOutcome(evs, false, false)
	if r.StopReason != protocol.StopCompleted || protocol.PlainText(r.Output) != "done" {
		t.Fatalf("result = %+v", r)
	}
	for i, ev := range evs {
		if ev.Seq != int64(i) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
	}
}

func TestTurnEndReasons(t *testing.T) {
	tests := []struct {
		script string
		kind   string
		stop   protocol.StopReason
		output string
	}{
		{"say ok", protocol.TurnCompleted, protocol.StopCompleted, "ok"},
		{"fail broken", protocol.TurnError, protocol.StopError, ""},
		{"refuse", protocol.TurnBlocked, protocol.StopRefusal, ""},
		{"max-tokens cut sho", protocol.TurnMaxTokens, protocol.StopMaxTokens, "cut sho"},
		{"call nosuch {}\nsay after", protocol.TurnCompleted, protocol.StopCompleted, "after"},
	}
	for _, tt := range tests {
		t.Run(tt.script, func(t *testing.T) {
			log := &memLog{}
			a := newTestAgent(t, model.NewScripted(), log, t.TempDir())
			out := a.RunTurn(context.Background(), userInput(tt.script))
			if out.Reason.Kind != tt.kind {
				t.Fatalf("turn end = %+v, want %s", out.Reason, tt.kind)
			}
			r := sessionlog.OneShotOutcome(a.Events(), false, false)
			if r.StopReason != tt.stop || protocol.PlainText(r.Output) != tt.output {
				t.Fatalf("result = %+v", r)
			}
		})
	}
}

func TestUnknownToolIsAnErrorResult(t *testing.T) {
	log := &memLog{}
	reg, _ := NewRegistry(ListDirTool(AnyWorkspace))
	reg, err := reg.Restrict(protocol.ToolFilter{Deny: []string{"list_dir"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(reg.Specs()) != 0 {
		t.Fatalf("denied tool still advertised: %+v", reg.Specs())
	}
	a, _ := New(Config{Header: protocol.SessionHeader{ID: "S", Cwd: t.TempDir()}, Log: log, Model: model.NewScripted(), Tools: reg})
	a.RunTurn(context.Background(), userInput("call list_dir {}\nsay x"))
	var res protocol.ToolResultData
	_ = a.Events()[5].Decode(&res)
	if !res.IsError || !strings.Contains(protocol.PlainText(res.Content), `unknown tool "list_dir"`) {
		t.Fatalf("result = %+v", res)
	}
}

// streamer streams its text, then blocks until cancelled.
type streamer struct{ text string }

func (s streamer) Provider() string { return "test" }
func (s streamer) Name() string     { return "streamer" }
func (s streamer) Stream(ctx context.Context, _ model.Request, onText func(string)) (model.Response, error) {
	onText(s.text)
	<-ctx.Done()
	return model.Response{}, ctx.Err()
}

func TestCancelKeepsPartialOutputAndCause(t *testing.T) {
	log := &memLog{}
	a := newTestAgent(t, streamer{"partial answ"}, log, t.TempDir())
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel(&Cancel{Cause: protocol.CauseDisposed}) }()
	out := a.RunTurn(ctx, userInput("anything"))
	if out.Reason.Kind != protocol.TurnAborted || out.Reason.Cause != protocol.CauseDisposed {
		t.Fatalf("reason = %+v", out.Reason)
	}
	r := sessionlog.OneShotOutcome(a.Events(), true, false)
	if r.StopReason != protocol.StopAborted || protocol.PlainText(r.Output) != "partial answ" {
		t.Fatalf("result = %+v", r)
	}
	var am protocol.AssistantMessageData
	_ = a.Events()[3].Decode(&am)
	if !am.Interrupted {
		t.Fatal("partial message must be marked interrupted")
	}
}

func TestLeaseLostAppendsNothing(t *testing.T) {
	log := &memLog{}
	a := newTestAgent(t, streamer{"x"}, log, t.TempDir())
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel(ErrLeaseLost) }()
	out := a.RunTurn(ctx, userInput("anything"))
	if !out.Fenced {
		t.Fatalf("outcome = %+v, want fenced", out)
	}
	if n := len(log.types()); n != 1 {
		t.Fatalf("%d records written; only the opening may exist", n)
	}
}

func TestFencedAppendStopsTheAgent(t *testing.T) {
	log := &memLog{}
	a := newTestAgent(t, model.NewScripted(), log, t.TempDir())
	if _, ok := a.OpenTurn(context.Background(), userInput("say hi")); !ok {
		t.Fatal("open failed")
	}
	log.fenced = true
	if out := a.RunSteps(context.Background()); !out.Fenced {
		t.Fatalf("outcome = %+v, want fenced", out)
	}
}

func TestListDirStaysInsideTheWorkspace(t *testing.T) {
	root := t.TempDir()
	ws := filepath.Join(root, "ws")
	_ = os.MkdirAll(filepath.Join(ws, "sub"), 0o755)
	_ = os.WriteFile(filepath.Join(root, "secret"), []byte("s"), 0o644)
	_ = os.Symlink(root, filepath.Join(ws, "escape"))
	tool := ListDirTool(AnyWorkspace)
	tc := ToolContext{Header: protocol.SessionHeader{Cwd: ws}}
	tests := []struct {
		args    string
		wantErr bool
		want    string
	}{
		{`{}`, false, "escape@\nsub/"},
		{`{"path":"sub"}`, false, "(empty directory)"},
		{`{"path":".."}`, true, "outside the workspace"},
		{`{"path":"` + root + `"}`, true, "outside the workspace"},
		{`{"path":"escape"}`, true, "outside the workspace"},
		{`{"path":"nope"}`, true, "no such file"},
		{`{"path":1}`, true, "invalid arguments"},
		{`{"bogus":1}`, true, "invalid arguments"},
	}
	for _, tt := range tests {
		r := tool.Run(context.Background(), tc, tt.args)
		got := protocol.PlainText(r.Content)
		if r.IsError != tt.wantErr || !strings.Contains(got, tt.want) {
			t.Errorf("list_dir %s = (%v) %q, want error=%v containing %q", tt.args, r.IsError, got, tt.wantErr, tt.want)
		}
	}
}

func TestCloseOpenTurnBalancesTheLog(t *testing.T) {
	log := &memLog{}
	a := newTestAgent(t, model.NewScripted(), log, t.TempDir())
	a.OpenTurn(context.Background(), userInput("x"))
	// Simulate a host that logged tool calls and died before their results.
	step, _ := protocol.NewEvent(protocol.EvStepStart, 0, protocol.StepData{Turn: 1, Step: 1})
	call, _ := protocol.NewEvent(protocol.EvToolCall, 0, protocol.ToolCallData{Turn: 1, Step: 1, CallID: "c1", Name: "list_dir"})
	evs, _ := log.Append(context.Background(), step, call)
	all := append(a.Events(), evs...)
	closing, err := sessionlog.CloseOpenTurn(all, protocol.TurnEndReason{Kind: protocol.TurnInterrupted}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, ev := range closing {
		types = append(types, ev.Type)
	}
	if strings.Join(types, ",") != "tool/result,step/end,turn/end" {
		t.Fatalf("closing = %v", types)
	}
	if _, open, _, _, pending := sessionlog.OpenTurn(append(all, closing...)); open || len(pending) > 0 {
		t.Fatal("turn still open after closing")
	}
	if r := sessionlog.OneShotOutcome(append(all, closing...), false, false); r.StopReason != protocol.StopError {
		t.Fatalf("interrupted must derive error, got %s", r.StopReason)
	}
}

func equal2(a, b [][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if strings.Join(a[i], ",") != strings.Join(b[i], ",") {
			return false
		}
	}
	return true
}

func TestReadFileStaysInsideTheWorkspaceAndNeverCutsSilently(t *testing.T) {
	root := t.TempDir()
	ws := filepath.Join(root, "ws")
	_ = os.MkdirAll(ws, 0o755)
	_ = os.WriteFile(filepath.Join(root, "secret"), []byte("s"), 0o644)
	_ = os.WriteFile(filepath.Join(ws, "notes.txt"), []byte("héllo wörld"), 0o644)
	_ = os.WriteFile(filepath.Join(ws, "bin"), []byte{0xff, 0xfe, 0x00}, 0o644)
	_ = os.Symlink(filepath.Join(root, "secret"), filepath.Join(ws, "link"))
	tool := ReadFileTool(AnyWorkspace)
	tc := ToolContext{Header: protocol.SessionHeader{Cwd: ws}}
	tests := []struct {
		args    string
		wantErr bool
		want    string
	}{
		{`{"path":"notes.txt"}`, false, "héllo wörld"},
		{`{"path":"notes.txt","offset":1,"limit":3}`, false, "él\n(9 more bytes; continue with offset 4)"},
		{`{"path":"notes.txt","limit":2}`, false, "h\n(12 more bytes; continue with offset 1)"}, // no half rune
		{`{"path":"../secret"}`, true, "outside the workspace"},
		{`{"path":"link"}`, true, "outside the workspace"},
		{`{"path":"` + filepath.Join(root, "secret") + `"}`, true, "outside the workspace"},
		{`{"path":"bin"}`, true, "not UTF-8"},
		{`{"path":"."}`, true, "is a directory"},
		{`{"path":"notes.txt","offset":99}`, true, "past the end"},
		{`{"path":"notes.txt","offset":-1}`, true, "offset"},
		{`{}`, true, "path is required"},
	}
	for _, tt := range tests {
		r := tool.Run(context.Background(), tc, tt.args)
		got := protocol.PlainText(r.Content)
		if r.IsError != tt.wantErr || !strings.Contains(got, tt.want) {
			t.Errorf("read_file %s = (%v) %q, want error=%v containing %q", tt.args, r.IsError, got, tt.wantErr, tt.want)
		}
	}
}

func TestWorkspaceToolsRefuseNamedPipesAndForeignRoots(t *testing.T) {
	ws := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(ws, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	tc := ToolContext{Header: protocol.SessionHeader{Cwd: ws}}
	done := make(chan ToolResult, 1)
	go func() { done <- ReadFileTool(AnyWorkspace).Run(context.Background(), tc, `{"path":"fifo"}`) }()
	select {
	case r := <-done:
		if !r.IsError || !strings.Contains(protocol.PlainText(r.Content), "not a regular file") {
			t.Fatalf("read_file of a fifo = %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("read_file blocked on a named pipe")
	}
	if r := ListDirTool(AnyWorkspace).Run(context.Background(), tc, `{"path":"fifo"}`); !r.IsError {
		t.Fatalf("list_dir of a fifo = %+v", r)
	}
	// Outside the worker's workspace roots, the tools refuse the whole session.
	other := t.TempDir()
	if r := ListDirTool(other).Run(context.Background(), tc, `{}`); !r.IsError || !strings.Contains(protocol.PlainText(r.Content), "workspace roots") {
		t.Fatalf("list_dir outside the roots = %+v", r)
	}
	if r := ListDirTool(filepath.Dir(ws)).Run(context.Background(), tc, `{}`); r.IsError {
		t.Fatalf("list_dir inside the roots = %+v", r)
	}
	// Outside the workspace, the answer never says whether a file exists.
	a := ReadFileTool(AnyWorkspace).Run(context.Background(), tc, `{"path":"/etc/hostname"}`)
	b := ReadFileTool(AnyWorkspace).Run(context.Background(), tc, `{"path":"/etc/does-not-exist"}`)
	if protocol.PlainText(a.Content) == "" || !strings.Contains(protocol.PlainText(b.Content), "outside the workspace") || !strings.Contains(protocol.PlainText(a.Content), "outside the workspace") {
		t.Fatalf("outside answers: %q / %q", protocol.PlainText(a.Content), protocol.PlainText(b.Content))
	}
}
