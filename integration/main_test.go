// Package integration holds black-box tests of the whole stack: several
// coordinators and workers on one embedded server, and worker processes that
// are killed and paused to test the settlement protocol (DESIGN.md §7).
package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
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
	p := &proc{cmd: exec.Command(broodBin, args...), done: make(chan struct{})}
	p.cmd.Stderr = lockedWriter{p}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
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
	return startProc(t, "spawn-worker", "--nats", url, "--log-level", "info",
		"--heartbeat", testutil.TestHeartbeat.String(), "--host-expiry", testutil.TestHostExpiry.String())
}
