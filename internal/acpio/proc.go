package acpio

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Teardown defaults (docs/upstream-behaviour.md §4, Teardown): the EOF grace is
// deliberately longer than the SIGTERM grace, so a child can flush its own
// persistence and reap its nested processes.
const (
	EOFGraceDefault  = 6 * time.Second
	TermGraceDefault = 3 * time.Second
	// killWaitMax bounds the wait after SIGKILL (a process stuck in the
	// kernel cannot be hurried).
	killWaitMax = 5 * time.Second
	// groupPoll is how often teardown checks whether the group is gone.
	groupPoll = 20 * time.Millisecond
	// stderrDrainMax bounds the wait for the rest of stderr after teardown.
	stderrDrainMax = time.Second
)

// StderrTailBytesDefault is how much of an agent's stderr is kept for
// diagnostics (the diagnostic itself is at most 4096 bytes).
const StderrTailBytesDefault = 4096

// Command is an ACP agent process to start.
type Command struct {
	Path string
	Args []string
	// Env is the complete environment (see AgentEnv); Dir the working directory.
	Env []string
	Dir string
	// StderrTailBytes bounds the stderr kept (default StderrTailBytesDefault).
	StderrTailBytes int
	// Redact replaces the values StderrTail must not show (nil: none).
	Redact *Redactor
	// OnStderrLine, if set, sees every stderr line (for debug logging).
	OnStderrLine func(string)
}

// Process is a running ACP agent in its own process group (its id is the
// agent's pid), so teardown signals reach every grandchild that stayed in
// the group. A grandchild that moves to a new session or group (setsid)
// escapes it; nothing short of a cgroup can follow that.
type Process struct {
	cmd  *exec.Cmd
	pgid int
	// Stdin is the agent's stdin (the JSON-RPC requests); Stdout its stdout.
	Stdin  *os.File
	Stdout *os.File
	stderr *os.File
	tail   *tailBuffer
	redact *Redactor

	exited     chan struct{}
	stderrDone chan struct{}
	waitErr    error
	tornDown   chan struct{}
	once       sync.Once
	report     TeardownReport
}

// Start starts c with stdin, stdout and stderr on pipes of this process.
// The pipes are plain files, not exec's copying goroutines, so the agent's
// exit is observed at once even while a grandchild still holds a pipe.
func Start(c Command) (*Process, error) {
	if c.StderrTailBytes <= 0 {
		c.StderrTailBytes = StderrTailBytesDefault
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		closeAll(inR, inW)
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(inR, inW, outR, outW)
		return nil, err
	}
	cmd := exec.Command(c.Path, c.Args...)
	cmd.Env = c.Env
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	cmd.Dir = c.Dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		closeAll(inR, inW, outR, outW, errR, errW)
		return nil, err
	}
	closeAll(inR, outW, errW)
	p := &Process{
		cmd: cmd, pgid: cmd.Process.Pid, Stdin: inW, Stdout: outR, stderr: errR,
		tail: &tailBuffer{max: c.StderrTailBytes, onLine: c.OnStderrLine}, redact: c.Redact,
		exited: make(chan struct{}), stderrDone: make(chan struct{}), tornDown: make(chan struct{}),
	}
	go func() {
		defer close(p.stderrDone)
		_, _ = io.Copy(p.tail, errR)
	}()
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

// Pid is the agent's pid; Pgid its process group (the same number).
func (p *Process) Pid() int  { return p.cmd.Process.Pid }
func (p *Process) Pgid() int { return p.pgid }

// Exited is closed once the agent process itself exited and was reaped.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitStatus describes how the agent exited ("exit status 3", "signal:
// killed"), or "" while it runs.
func (p *Process) ExitStatus() string {
	select {
	case <-p.exited:
	default:
		return ""
	}
	if p.waitErr == nil {
		return "exit status 0"
	}
	var ee *exec.ExitError
	if errors.As(p.waitErr, &ee) {
		return ee.ProcessState.String()
	}
	return p.waitErr.Error()
}

// WaitStderr waits, at most d, until the agent's stderr reached its end (every
// writer closed it), so a tail read right after the process exited holds what
// it wrote last. A grandchild holding stderr open only delays it by d.
func (p *Process) WaitStderr(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.stderrDone:
	case <-t.C:
	}
}

// StderrTail returns at most n bytes of the end of the agent's stderr, whole
// lines where possible, with the Redact values replaced.
func (p *Process) StderrTail(n int) string {
	s := p.tail.String()
	s = p.redact.Redact(s)
	if len(s) > n {
		s = s[len(s)-n:]
		if i := strings.IndexByte(s, '\n'); i >= 0 && i < len(s)-1 {
			s = s[i+1:]
		}
	}
	return strings.TrimSpace(strings.ToValidUTF8(s, "?"))
}

// TeardownReport says how far the ladder had to go.
type TeardownReport struct {
	// Step is "eof", "sigterm", "sigkill" or "stuck" (the group survived
	// SIGKILL for killWaitMax).
	Step     string
	Duration time.Duration
}

// Teardown ends the agent and every process of its group (docs/upstream-behaviour.md
// §4, Teardown): close stdin (EOF) and wait up to eofGrace for the whole group
// to exit; else SIGTERM the group and wait up to termGrace; else SIGKILL the
// group. The agent is reaped and the pipes are closed. Idempotent: later calls
// wait for the first and return its report. Zero graces take the defaults.
func (p *Process) Teardown(eofGrace, termGrace time.Duration) TeardownReport {
	p.once.Do(func() {
		defer close(p.tornDown)
		if eofGrace <= 0 {
			eofGrace = EOFGraceDefault
		}
		if termGrace <= 0 {
			termGrace = TermGraceDefault
		}
		start := time.Now()
		_ = p.Stdin.Close()
		step := "eof"
		if !p.waitGone(eofGrace) {
			step = "sigterm"
			_ = syscall.Kill(-p.pgid, syscall.SIGTERM)
			if !p.waitGone(termGrace) {
				step = "sigkill"
				_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
				if !p.waitGone(killWaitMax) {
					step = "stuck"
				}
			}
		}
		// Keep the last of stderr (its writers are gone, so it ends soon),
		// then unblock the readers even if an escaped grandchild still holds
		// a pipe.
		select {
		case <-p.stderrDone:
		case <-time.After(stderrDrainMax):
		}
		_ = p.Stdout.Close()
		_ = p.stderr.Close()
		p.report = TeardownReport{Step: step, Duration: time.Since(start)}
	})
	<-p.tornDown
	return p.report
}

// waitGone waits up to d for the agent to exit and its group to empty.
func (p *Process) waitGone(d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(groupPoll)
	defer tick.Stop()
	for {
		wake := p.exited
		select {
		case <-p.exited:
			if !GroupAlive(p.pgid) {
				return true
			}
			wake = nil // exited already: poll the rest of the group
		default:
		}
		select {
		case <-deadline.C:
			return false
		case <-tick.C:
		case <-wake:
		}
	}
}

// GroupAlive reports whether any live process belongs to process group
// pgid. Zombies do not count: a reaped-by-nobody orphan is dead, and PID 1
// may be slow to reap it.
func GroupAlive(pgid int) bool {
	if pgid <= 0 {
		return false
	}
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	live, ok := liveInGroup(pgid)
	if !ok {
		return true // cannot tell without /proc: assume alive
	}
	return len(live) > 0
}

// GroupMembers lists the live (non-zombie) pids of process group pgid, read
// from /proc; ok is false when /proc cannot be read.
func GroupMembers(pgid int) (pids []int, ok bool) { return liveInGroup(pgid) }

func liveInGroup(pgid int) ([]int, bool) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, false
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		state, group, ok := parseStat(string(data))
		if ok && group == pgid && state != 'Z' && state != 'X' {
			out = append(out, pid)
		}
	}
	return out, true
}

// parseStat reads the state and process group from /proc/<pid>/stat: the
// fields after the command name (which is in parentheses and may contain
// spaces) are "state ppid pgrp ...".
func parseStat(s string) (state byte, pgrp int, ok bool) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 3 || len(f[0]) != 1 {
		return 0, 0, false
	}
	g, err := strconv.Atoi(f[2])
	if err != nil {
		return 0, 0, false
	}
	return f[0][0], g, true
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu      sync.Mutex
	buf     []byte
	max     int
	onLine  func(string)
	partial []byte
}

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	if t.onLine != nil {
		t.partial = append(t.partial, b...)
		for {
			i := indexNL(t.partial)
			if i < 0 {
				break
			}
			t.onLine(string(t.partial[:i]))
			t.partial = t.partial[i+1:]
		}
		if len(t.partial) > t.max {
			t.onLine(string(t.partial))
			t.partial = nil
		}
	}
	return len(b), nil
}

func indexNL(b []byte) int {
	for i, c := range b {
		if c == '\n' {
			return i
		}
	}
	return -1
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// String renders a report for logs.
func (r TeardownReport) String() string {
	return fmt.Sprintf("%s after %s", r.Step, r.Duration.Round(time.Millisecond))
}
