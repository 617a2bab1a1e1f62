package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/webui"
)

// A nested delegation with --progress always (a terminal's default): stderr
// shows the child's tool calls and its child starting and ending with the
// elapsed time; stdout is only the result. Piped (auto, not a terminal),
// stderr has only the child's id.
func TestRunProgress(t *testing.T) {
	c := newCLI(t)
	prompt := "call list_dir {}\n" +
		`call subagent {"description":"gc","prompt":"sleep 300ms\nsay from the grandchild"}` + "\n" +
		"say done"
	o := c.ok("run", "--provider", "spawn", "--progress", "always", prompt)
	if o.out != "done\n" {
		t.Fatalf("stdout %q: only the result", o.out)
	}
	for _, want := range []string{
		`(?m)^\[ *\d+(ms|\.\ds)\] child [0-9A-Z]{26}\s*$`,
		`(?m)^\[ *[\d.]+m?s\] tool list_dir\s*$`,
		`(?m)^\[ *[\d.]+m?s\] tool list_dir done \([\d.]+m?s\)`,
		`(?m)^\[ *[\d.]+m?s\] tool subagent \{"description":"gc"`,
		`(?m)^\[ *[\d.]+m?s\]   child [0-9A-Z]{26} \(spawn\) started`,
		`(?m)^\[ *[\d.]+m?s\]   child [0-9A-Z]{26} completed \([\d.]+m?s\)`,
		`(?m)^\[ *[\d.]+m?s\] tool subagent done \([\d.]+m?s\)`,
	} {
		if !regexp.MustCompile(want).MatchString(o.err) {
			t.Errorf("stderr lacks %s:\n%s", want, o.err)
		}
	}
	// The grandchild's end follows its start (one stream; the child's tool
	// calls come from its log, another stream: no order between the two).
	if started, ended := strings.Index(o.err, ") started"), strings.Index(o.err, " completed ("); started < 0 || started > ended {
		t.Errorf("progress out of order:\n%s", o.err)
	}
	if regexp.MustCompile(`· \d+ tool calls`).MatchString(o.err) {
		t.Errorf("a status line was drawn on stderr that is no terminal:\n%s", o.err)
	}

	o = c.ok("run", "--provider", "spawn", prompt) // auto: the test's buffers are no terminal
	if o.out != "done\n" || !regexp.MustCompile(`^child [0-9A-Z]{26}\n`+usageRE+`$`).MatchString(o.err) {
		t.Fatalf("piped: stdout %q stderr %q", o.out, o.err)
	}
	c.fails("INVALID_ARGUMENT", "run", "--provider", "spawn", "--progress", "sometimes", "say x")
}

// followup --wait sends the message, waits for the turn that runs it and
// prints that turn's answer (the messageId on stderr), with its progress.
func TestFollowupWait(t *testing.T) {
	c := newCLI(t)
	child := c.startChild("--label", "w", "say one")
	o := c.ok("followup", "--wait", "--progress", "always", child, "call list_dir {}\nsay two")
	if o.out != "two\n" {
		t.Fatalf("stdout %q", o.out)
	}
	for _, want := range []string{`messageId [0-9A-Z]{26}`, `tool list_dir done`, child + `: turn 2 completed`} {
		if !regexp.MustCompile(want).MatchString(o.err) {
			t.Errorf("stderr lacks %s:\n%s", want, o.err)
		}
	}
	// Piped and --json: the answer of the right turn, whichever ran last.
	r := decodeJSON[childResult](t, c.ok("followup", "--wait", "--json", child, "say three").out)
	if r.Turn != 3 || protocol.PlainText(r.Output) != "three" || r.StopReason != protocol.StopCompleted {
		t.Fatalf("--json: %+v", r)
	}
	// A turn that does not complete exits 1 with the reason first.
	o = c.run("followup", "--wait", child, "fail boom")
	if o.code != 1 || !strings.HasPrefix(o.err, "messageId ") || !strings.Contains(o.err, "ERROR: turn 4 of "+child+" ended with stopReason error") {
		t.Fatalf("failing turn: exit %d stderr %q", o.code, o.err)
	}
	// Its usage line comes before the code, which stays the last line of
	// stderr (README: "otherwise the last line of stderr starts with the
	// code"), for scripts that read it.
	if lines := strings.Split(strings.TrimSuffix(o.err, "\n"), "\n"); len(lines) < 2 ||
		!strings.HasPrefix(lines[len(lines)-2], "usage: own ") || !strings.HasPrefix(lines[len(lines)-1], "MODEL_ERROR: turn 4 of "+child) {
		t.Fatalf("failing turn: the last line of stderr is not the code after the usage line: %q", o.err)
	}
}

// The tree `brood watch` draws on a terminal.
func TestWatchTreeLines(t *testing.T) {
	now := time.UnixMilli(10_000)
	nodes := []webui.Node{
		{ID: "ROOT", Root: true, State: webui.StateRoot, Start: 1000},
		{ID: "A", Parent: "ROOT", Provider: "spawn", Mode: protocol.ModeOneShot, State: webui.StateSettled, StopReason: "completed", Start: 1000, End: 4000},
		{ID: "B", Parent: "A", Provider: "fork", Mode: protocol.ModeOneShot, State: webui.StateRunning, Start: 2000},
		{ID: "C", Parent: "A", Provider: "spawn", Mode: protocol.ModeOneShot, State: webui.StateSettled, StopReason: "error", ErrorCode: "HOST_LOST", Start: 2500, End: 3000},
		{ID: "D", Parent: "ROOT", Provider: "acp", Mode: protocol.ModeContinuable, State: webui.StateIdle, StopReason: "completed", Epochs: 2, Start: 5000, End: 6000},
	}
	want := []string{
		"root ROOT",
		"├─ A  spawn  completed  3.0s",
		"│  ├─ B  fork  running  8.0s",
		"│  └─ C  spawn  error HOST_LOST  500ms",
		"└─ D  acp  continuable ×2  idle (completed)  1.0s",
	}
	if got := treeLines(nodes, "", now); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("tree:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// A subtree: its top is the watched parent.
	if got := treeLines(nodes, "A", now); len(got) != 3 || !strings.HasPrefix(got[0], "A  spawn") {
		t.Fatalf("subtree of A: %q", got)
	}
}
