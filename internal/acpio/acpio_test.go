package acpio

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestValidateDir(t *testing.T) {
	dir := t.TempDir()
	locked := dir + "/locked"
	if err := os.Mkdir(locked, 0o600); err != nil {
		t.Fatal(err)
	}
	file := dir + "/f"
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		dir, want string
	}{
		{dir, ""},
		{"", "no workspace"},
		{"rel/dir", "not an absolute path"},
		{dir + "/missing", "no such file"},
		{file, "not a directory"},
	}
	if os.Geteuid() != 0 { // root may enter anything: see TestValidateDirRefusesAnUnenterableDirectory
		tests = append(tests, struct{ dir, want string }{locked, "cannot be entered"})
	}
	for _, tt := range tests {
		err := ValidateDir(tt.dir)
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("ValidateDir(%q) = %v, want %q", tt.dir, err, tt.want)
		}
	}
}

// TestValidateDirRefusesAnUnenterableDirectory: a directory without search
// permission is refused as "cannot be entered". Root may enter any
// directory, and CI runs as root, so there the check runs in a child
// process of this test binary under an unprivileged user (nobody), against
// a directory that user may stat but not enter: the case runs either way.
func TestValidateDirRefusesAnUnenterableDirectory(t *testing.T) {
	if dir := os.Getenv(validateDirHelperEnv); dir != "" {
		return // the child's side runs in TestValidateDirHelperProcess
	}
	base, err := os.MkdirTemp("", "acpio-validate-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	locked := filepath.Join(base, "locked")
	if err := os.Mkdir(locked, 0o755); err != nil {
		t.Fatal(err)
	}
	// 0o644: anyone may stat it and list its names, nobody may enter it.
	if err := os.Chmod(locked, 0o644); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		if err := ValidateDir(locked); err == nil || !strings.Contains(err.Error(), "cannot be entered") {
			t.Fatalf("ValidateDir(%q) = %v, want cannot be entered", locked, err)
		}
		return
	}
	// As root: the test binary, copied where nobody may run it, checks the
	// directory as nobody.
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(base, "acpio.test")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	const nobody = 65534
	cmd := exec.Command(bin, "-test.run=^TestValidateDirHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), validateDirHelperEnv+"="+locked)
	cmd.Dir = base
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the check as nobody failed: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "checked as uid 65534") {
		t.Fatalf("the child did not run the check:\n%s", out)
	}
}

const validateDirHelperEnv = "ACPIO_VALIDATE_DIR_AS_NOBODY"

// TestValidateDirHelperProcess is the child side of
// TestValidateDirRefusesAnUnenterableDirectory; alone it does nothing.
func TestValidateDirHelperProcess(t *testing.T) {
	dir := os.Getenv(validateDirHelperEnv)
	if dir == "" {
		return
	}
	if os.Geteuid() == 0 {
		t.Fatal("the helper runs as root: the check would prove nothing")
	}
	if err := ValidateDir(dir); err == nil || !strings.Contains(err.Error(), "cannot be entered") {
		t.Fatalf("ValidateDir(%q) = %v, want cannot be entered", dir, err)
	}
	t.Logf("checked as uid %d", os.Geteuid())
	os.Stdout.WriteString("checked as uid " + strconv.Itoa(os.Geteuid()) + "\n")
}

func TestLineFilter(t *testing.T) {
	long := `{"jsonrpc":"2.0","method":"x","params":{"t":"` + strings.Repeat("a", 200<<10) + `"}}`
	input := strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"result":{}}`,
		"Starting agent v1.2 ...",
		"",
		long,
		`{not json`,
		`[1,2]`,
		`  {"jsonrpc":"2.0","id":2,"result":{}}  ` + "\r",
		`{"jsonrpc":"2.0","method":"huge","params":"` + strings.Repeat("b", 3000) + `"}`,
		`{"jsonrpc":"2.0","id":3,"result":{}}`, // last line without a newline
	}, "\n")
	var lines int
	var drops []Drop
	f := NewLineFilter(strings.NewReader(input), 0, func() { lines++ }, func(d Drop) { drops = append(drops, d) })
	out, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(got) != 5 || got[0] != `{"jsonrpc":"2.0","id":1,"result":{}}` || got[1] != long ||
		got[2] != `{"jsonrpc":"2.0","id":2,"result":{}}` || got[4] != `{"jsonrpc":"2.0","id":3,"result":{}}` {
		t.Fatalf("forwarded %d lines: %.200q", len(got), got)
	}
	if lines != 5 || len(drops) != 3 {
		t.Fatalf("lines %d, drops %+v", lines, drops)
	}

	drops = nil
	f = NewLineFilter(strings.NewReader(long+"\n"+`{"a":1}`+"\n"), 1000, nil, func(d Drop) { drops = append(drops, d) })
	out, _ = io.ReadAll(f)
	if string(out) != `{"a":1}`+"\n" || len(drops) != 1 || !drops[0].Oversize || drops[0].Bytes <= 1002 || drops[0].Bytes > len(long)+1 {
		t.Fatalf("oversize: out %q drops %+v", out, drops)
	}
}

// chunkReader returns its chunks one Read each.
type chunkReader struct{ chunks []string }

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.chunks[0])
	r.chunks[0] = r.chunks[0][n:]
	if r.chunks[0] == "" {
		r.chunks = r.chunks[1:]
	}
	return n, nil
}

// TestLineFilterOversizeLineEndingInTheCrossingRead: a line whose newline
// arrives in the very read that takes it past the limit is still oversize.
func TestLineFilterOversizeLineEndingInTheCrossingRead(t *testing.T) {
	var drops []Drop
	r := &chunkReader{chunks: []string{strings.Repeat("x", 1000), strings.Repeat("x", 500) + "\n" + `{"a":1}` + "\n"}}
	out, _ := io.ReadAll(NewLineFilter(r, 1000, nil, func(d Drop) { drops = append(drops, d) }))
	if string(out) != `{"a":1}`+"\n" || len(drops) != 1 || !drops[0].Oversize || drops[0].Bytes != 1500 {
		t.Fatalf("out %q drops %+v", out, drops)
	}
}

// TestLineFilterReportsAnOversizeLineWhenItCrossesTheLimit is issue 14,
// item 7: an agent that writes more than the limit without a newline (and
// then nothing) is reported at once, not when (if ever) the line ends.
func TestLineFilterReportsAnOversizeLineWhenItCrossesTheLimit(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	dropped := make(chan Drop, 4)
	f := NewLineFilter(pr, 1000, nil, func(d Drop) { dropped <- d })
	out := make(chan string, 1)
	go func() {
		b := make([]byte, 100)
		n, _ := f.Read(b)
		out <- string(b[:n])
	}()
	// Small writes, as an agent streaming its output would do.
	for i := 0; i < 11; i++ {
		if _, err := pw.Write([]byte(strings.Repeat("z", 100))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case d := <-dropped:
		if !d.Oversize || d.Bytes <= 1002 || d.Bytes > 1100 {
			t.Fatalf("drop %+v", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the oversize line was not reported while it had no newline")
	}
	// The rest of the line is discarded without another report; the next
	// line goes through.
	if _, err := pw.Write([]byte(strings.Repeat("z", 5000) + "\n" + `{"ok":true}` + "\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-out:
		if got != `{"ok":true}`+"\n" {
			t.Fatalf("forwarded %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the line after the oversize one was not forwarded")
	}
	if len(dropped) != 0 {
		t.Fatalf("reported again: %+v", <-dropped)
	}
}

func startSh(t *testing.T, script string) *Process {
	t.Helper()
	p, err := Start(Command{Path: "/bin/sh", Args: []string{"-c", script}, Env: []string{"PATH=/usr/bin:/bin"}, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Teardown(100*time.Millisecond, 100*time.Millisecond) })
	return p
}

// waitLine reads stdout until it has a line (the script's "ready").
func waitLine(t *testing.T, p *Process) {
	t.Helper()
	buf := make([]byte, 64)
	if _, err := p.Stdout.Read(buf); err != nil {
		t.Fatalf("read ready: %v (stderr %q)", err, p.StderrTail(500))
	}
}

func TestTeardownLadder(t *testing.T) {
	tests := []struct {
		name, script, step string
	}{
		{"exits at EOF", `echo ready; cat >/dev/null`, "eof"},
		{"needs SIGTERM", `sleep 1000 & echo ready; wait`, "sigterm"},
		{"ignores EOF and SIGTERM, with a grandchild", `trap '' TERM; sh -c 'trap "" TERM; sleep 1000' & echo ready; while :; do sleep 1; done`, "sigkill"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := startSh(t, tt.script)
			waitLine(t, p)
			if !GroupAlive(p.Pgid()) {
				t.Fatal("group not alive after start")
			}
			start := time.Now()
			rep := p.Teardown(300*time.Millisecond, 300*time.Millisecond)
			if rep.Step != tt.step {
				t.Fatalf("teardown step %s, want %s", rep.Step, tt.step)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("teardown took %s", d)
			}
			if GroupAlive(p.Pgid()) {
				pids, _ := GroupMembers(p.Pgid())
				t.Fatalf("processes of group %d remain: %v", p.Pgid(), pids)
			}
			select {
			case <-p.Exited():
			default:
				t.Fatal("agent not reaped")
			}
			if again := p.Teardown(0, 0); again != rep {
				t.Fatalf("second teardown %v != %v", again, rep)
			}
		})
	}
}

func TestStderrTailRedacts(t *testing.T) {
	p, err := Start(Command{Path: "/bin/sh", Args: []string{"-c", `echo "first line"; echo "token sk-secret-value here" >&2; echo "last" >&2`},
		Env: []string{"PATH=/usr/bin:/bin"}, Redact: NewRedactor([]string{"OPENAI_API_KEY=sk-secret-value"}, nil)})
	if err != nil {
		t.Fatal(err)
	}
	p.Teardown(time.Second, time.Second)
	deadline := time.Now().Add(2 * time.Second)
	for !strings.Contains(p.StderrTail(4096), "last") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	tail := p.StderrTail(4096)
	if !strings.Contains(tail, "token [redacted] here") || strings.Contains(tail, "sk-secret") {
		t.Fatalf("tail %q", tail)
	}
	if p.ExitStatus() != "exit status 0" {
		t.Fatalf("exit status %q", p.ExitStatus())
	}
}
