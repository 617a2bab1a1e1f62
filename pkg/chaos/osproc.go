package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// osProc is one run of a program, its output appended to a log file and
// scanned for a readiness line. A new osProc is made for every (re)start.
type osProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // Wait's error, set before done closes

	mu   sync.Mutex
	tail bytes.Buffer // output since start, for readiness checks (bounded)
}

// procTailBytesMax bounds the output an osProc keeps in memory.
const procTailBytesMax = 1 << 20

type tailWriter struct {
	p   *osProc
	log *os.File
}

func (w tailWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	if w.p.tail.Len() < procTailBytesMax {
		w.p.tail.Write(b)
	}
	w.p.mu.Unlock()
	return w.log.Write(b)
}

// startProc starts bin with args and env (added to the harness's own
// environment), appending its stdout and stderr to logPath.
func startProc(bin string, args, env []string, logPath, banner string) (*osProc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "\n==== %s %s: %s %v\n", time.Now().Format(time.RFC3339Nano), banner, bin, args)
	p := &osProc{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	w := tailWriter{p: p, log: f}
	p.cmd.Stdout, p.cmd.Stderr = w, w
	// Its own process group: a signal to the harness (Ctrl-C) does not reach
	// it twice, and nothing it starts outlives a kill of the group.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		fmt.Fprintf(f, "==== %s exited: %v\n", time.Now().Format(time.RFC3339Nano), p.err)
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *osProc) Pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended.
func (p *osProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process group.
func (p *osProc) signal(sig syscall.Signal) error {
	if p.exited() {
		return errors.New("process has exited")
	}
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

// kill sends SIGKILL (to a stopped process too) and waits for the exit.
func (p *osProc) kill() {
	_ = p.signal(syscall.SIGKILL)
	<-p.done
}

// terminate sends SIGTERM (continuing a stopped process first) and waits up
// to grace for the exit, then kills.
func (p *osProc) terminate(grace time.Duration) {
	_ = p.signal(syscall.SIGCONT)
	_ = p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.kill()
	}
}

// output returns what the process wrote since it started (up to procTailBytesMax).
func (p *osProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tail.String()
}

// waitOutput waits until the output contains line, the process exits, or ctx ends.
func (p *osProc) waitOutput(ctx context.Context, line string) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if bytes.Contains([]byte(p.output()), []byte(line)) {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("exited (%v) before printing %q", p.err, line)
		case <-ctx.Done():
			return fmt.Errorf("no %q within the deadline: %w", line, ctx.Err())
		case <-t.C:
		}
	}
}
