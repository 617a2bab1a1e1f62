// Package integration holds black-box tests of the whole stack: several
// coordinators and workers on one embedded server, and worker processes that
// are killed and paused to test the settlement protocol (docs/design.md §7).
package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
)

// broodBin is the brood binary built once for the process tests.
var broodBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "brood-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	broodBin = filepath.Join(dir, "brood")
	build := exec.Command("go", "build", "-o", broodBin, "../cmd/brood")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build brood:", err)
		os.Exit(1)
	}
	code := m.Run()
	// A test that leaves a goroutine behind fails the package (goleak, as
	// in every package whose tests start goroutines).
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left behind:", err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a brood process started by a test, with its stderr kept.
type proc struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	stderr bytes.Buffer
	done   chan struct{}
}

type lockedWriter struct{ p *proc }

func (w lockedWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	return w.p.stderr.Write(b)
}

// startProc runs `brood args...`; it is killed at the end of the test.
func startProc(t *testing.T, args ...string) *proc {
	t.Helper()
	return startProcWith(t, nil, args...)
}

// startProcGroup is startProc in a process group of its own (as `setsid`
// would), so signal reaches the process and anything it started.
func startProcGroup(t *testing.T, args ...string) *proc {
	t.Helper()
	return startProcWith(t, &syscall.SysProcAttr{Setpgid: true}, args...)
}

// signal sends sig to the process's group (startProcGroup) or the process.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	pid := p.cmd.Process.Pid
	if p.cmd.SysProcAttr != nil && p.cmd.SysProcAttr.Setpgid {
		pid = -pid
	}
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

func startProcWith(t *testing.T, attr *syscall.SysProcAttr, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(broodBin, args...), done: make(chan struct{})}
	p.cmd.SysProcAttr = attr
	p.cmd.Stderr = lockedWriter{p}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		if attr != nil && attr.Setpgid {
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGCONT)
		}
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("stderr of %v:\n%s", args, p.Stderr())
		}
	})
	return p
}

// Stderr returns what the process wrote to stderr so far.
func (p *proc) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// waitStderr waits until the process's stderr contains s.
func (p *proc) waitStderr(t *testing.T, s string, total time.Duration) {
	t.Helper()
	testutil.Eventually(t, total, func() bool { return strings.Contains(p.Stderr(), s) }, "stderr contains %q", s)
}

// spawnWorkerProc starts a spawn worker process with the test timing.
func spawnWorkerProc(t *testing.T, url string) *proc {
	return startProc(t, "spawn-worker", "--nats", url, "--log-level", "info", "--model", "scripted",
		"--heartbeat", stack.Heartbeat.String(), "--host-expiry", stack.HostExpiry.String())
}

// dev is a `brood dev` process started by a test, with what it printed.
type dev struct {
	cmd        *exec.Cmd
	done       chan struct{}  // closed when the process exited
	out        *lockedBuilder // all it printed on stdout so far
	natsURL    string
	metricsURL string // http://ADDR/metrics when started with --metrics
	uiURL      string // the web view's page when started with --ui
	stdout     []string
}

// startDev runs `brood dev` on a fresh data directory and a free port, with
// extra args, and waits for its start-up lines. It is stopped (SIGTERM, a
// drain) at the end of the test.
func startDev(t *testing.T, args ...string) *dev {
	t.Helper()
	return startDevEnv(t, nil, args...)
}

// startDevEnv is startDev with env added to the process's environment.
func startDevEnv(t *testing.T, env []string, args ...string) *dev {
	t.Helper()
	cmd := exec.Command(broodBin, append([]string{"dev", "--data", t.TempDir(), "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &lockedBuilder{b: &stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("brood dev stderr:\n%s", stderr.String())
		}
	})
	// The banner ends with the line naming Ctrl-C (and the metrics line, when asked).
	lines := make(chan []string, 1)
	d := &dev{cmd: cmd, done: done, out: &lockedBuilder{b: &strings.Builder{}}}
	go func() {
		var seen []string
		sc := bufio.NewScanner(stdout)
		sent := false
		for sc.Scan() {
			seen = append(seen, sc.Text())
			_, _ = d.out.Write([]byte(sc.Text() + "\n"))
			last := sc.Text()
			if !sent && (strings.Contains(last, "metrics on ") || (strings.Contains(last, "Ctrl-C") && !slices.Contains(args, "--metrics"))) {
				lines <- append([]string(nil), seen...)
				sent = true
			}
		}
		if !sent {
			lines <- seen
		}
	}()
	select {
	case d.stdout = <-lines:
	case <-time.After(30 * time.Second):
		t.Fatal("brood dev did not print its start-up lines in 30s")
	}
	for _, l := range d.stdout {
		if _, v, ok := strings.Cut(l, "NATS client URL "); ok {
			d.natsURL = strings.TrimSpace(v)
		}
		if _, v, ok := strings.Cut(l, "metrics on "); ok {
			d.metricsURL = strings.TrimSpace(v)
		}
		if _, v, ok := strings.Cut(l, "web view on "); ok {
			d.uiURL = strings.TrimSpace(v)
		}
	}
	if d.natsURL == "" {
		t.Fatalf("brood dev printed no NATS URL: %q", d.stdout)
	}
	return d
}

// Stdout returns what the process printed on stdout so far.
func (d *dev) Stdout() string {
	d.out.mu.Lock()
	defer d.out.mu.Unlock()
	return d.out.b.String()
}

type lockedBuilder struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// spawnWorkerGroup starts a spawn worker process in its own process group
// (to pause it with SIGSTOP) with the given host expiry.
func spawnWorkerGroup(t *testing.T, url string, expiry time.Duration) *proc {
	return startProcGroup(t, "spawn-worker", "--nats", url, "--log-level", "info", "--model", "scripted",
		"--heartbeat", stack.Heartbeat.String(), "--host-expiry", expiry.String())
}
