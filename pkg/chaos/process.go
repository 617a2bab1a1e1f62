package chaos

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Endpoint is one client of the cluster (a process, or a connection of the
// test itself) with its own proxy to every node, so a fault can cut exactly
// that client from one server ("a client cut from its server") or from all.
type Endpoint struct {
	Name    string
	proxies []*Proxy // by node index
}

// newSiteEndpoint creates the proxy of a new client of the site named name:
// its only link is to the site's leaf node (index 0).
func (c *Cluster) newSiteEndpoint(name string) (*Endpoint, error) {
	if c.site == nil {
		return nil, errors.New("chaos: a process at the site of a cluster without one (ClusterConfig.Site)")
	}
	p, err := NewProxy(name+">"+c.site.Name, c.site.ClientAddr())
	if err != nil {
		return nil, err
	}
	e := &Endpoint{Name: name, proxies: []*Proxy{p}}
	c.mu.Lock()
	c.endpoints = append(c.endpoints, e)
	c.mu.Unlock()
	return e, nil
}

// NewEndpoint creates the proxies of a new client named name.
func (c *Cluster) NewEndpoint(name string) (*Endpoint, error) {
	e := &Endpoint{Name: name}
	for _, n := range c.nodes {
		p, err := NewProxy(name+">"+n.Name, n.ClientAddr())
		if err != nil {
			e.close()
			return nil, err
		}
		e.proxies = append(e.proxies, p)
	}
	c.mu.Lock()
	c.endpoints = append(c.endpoints, e)
	c.mu.Unlock()
	return e, nil
}

// URLs is the comma-separated list of the endpoint's proxy URLs, starting at
// node first (so clients spread over the nodes) and going round.
func (e *Endpoint) URLs(first int) string {
	var us []string
	for k := range e.proxies {
		us = append(us, "nats://"+e.proxies[(first+k)%len(e.proxies)].Addr())
	}
	return strings.Join(us, ",")
}

// Proxy returns the endpoint's proxy to node i.
func (e *Endpoint) Proxy(i int) *Proxy { return e.proxies[i] }

// Connected returns the nodes the endpoint has open connections to.
func (e *Endpoint) Connected() []int {
	var out []int
	for i, p := range e.proxies {
		if p.Active() > 0 {
			out = append(out, i)
		}
	}
	return out
}

// SetNode sets the endpoint's link to node i. A site's endpoint has one
// link, to the site (index 0): a fault of another node leaves it alone
// (the site's links to the nodes are the cluster's, SetSiteLinks).
func (e *Endpoint) SetNode(i int, mode LinkMode, delay time.Duration) {
	if i < len(e.proxies) {
		e.proxies[i].Set(mode, delay)
	}
}

// SetAll sets the endpoint's links to every node.
func (e *Endpoint) SetAll(mode LinkMode, delay time.Duration) {
	for _, p := range e.proxies {
		p.Set(mode, delay)
	}
}

// Heal lets every link of the endpoint pass again.
func (e *Endpoint) Heal() { e.SetAll(Pass, 0) }

func (e *Endpoint) close() {
	for _, p := range e.proxies {
		p.Close()
	}
}

// ProcessSpec describes a process of the system under test.
type ProcessSpec struct {
	// Name is unique in the cluster ("coordinator-1", "spawn-worker-2").
	Name string
	// Binary is the program (for Brood's services, the brood binary of Build).
	Binary string
	// Args are its arguments; the harness appends URLFlag and the endpoint's
	// proxy URLs (e.g. `--nats nats://127.0.0.1:41001,...`).
	Args []string
	// URLFlag is the flag that takes the NATS URLs ("--nats").
	URLFlag string
	// FirstNode is the node whose proxy comes first in the URL list.
	FirstNode int
	// Env is added to the harness's environment.
	Env []string
	// ReadyLine is printed by the process once it serves; Start waits for it
	// ("" waits for nothing).
	ReadyLine string
	// AtSite connects the process to the site's leaf node only
	// (ClusterConfig.Site) instead of the cluster's nodes.
	AtSite bool
}

// Process is a process of the system under test, reaching the cluster through
// its own Endpoint. Kill, Pause, Resume and Restart are the process faults;
// the endpoint's links are the network faults between it and the servers.
type Process struct {
	c    *Cluster
	Spec ProcessSpec
	*Endpoint
	logPath string

	mu       sync.Mutex
	proc     *osProc
	paused   bool
	restarts int
}

// StartProcess creates the process's endpoint and starts it.
func (c *Cluster) StartProcess(ctx context.Context, spec ProcessSpec) (*Process, error) {
	if spec.Name == "" || spec.Binary == "" {
		return nil, errors.New("chaos: ProcessSpec.Name and Binary are required")
	}
	if spec.URLFlag == "" {
		spec.URLFlag = "--nats"
	}
	newEndpoint := c.NewEndpoint
	if spec.AtSite {
		newEndpoint = c.newSiteEndpoint
	}
	ep, err := newEndpoint(spec.Name)
	if err != nil {
		return nil, err
	}
	p := &Process{c: c, Spec: spec, Endpoint: ep, logPath: filepath.Join(c.cfg.Dir, "logs", spec.Name+".log")}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, p.Start(ctx)
}

// Processes returns every process started so far.
func (c *Cluster) Processes() []*Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Process(nil), c.procs...)
}

// LogPath is the file the process's output is appended to (every run).
func (p *Process) LogPath() string { return p.logPath }

// Start starts the process (again) and waits for its ReadyLine. A process
// that exits before printing it is started again after RestartDelay until
// ctx ends, as a supervisor (systemd Restart=on-failure, Kubernetes) would:
// Brood's services exit when they cannot open their streams and buckets,
// which is expected while the cluster recovers from a fault.
func (p *Process) Start(ctx context.Context) error {
	for {
		op, err := p.startOnce()
		if err != nil {
			return err
		}
		if p.Spec.ReadyLine == "" {
			return nil
		}
		err = op.waitOutput(ctx, p.Spec.ReadyLine)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || !op.exited() {
			op.kill()
			return fmt.Errorf("chaos: process %s: %w (see %s)", p.Spec.Name, err, p.logPath)
		}
		p.c.logf("process %s: %v; starting it again", p.Spec.Name, err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("chaos: process %s: %w (see %s)", p.Spec.Name, err, p.logPath)
		case <-time.After(RestartDelay):
		}
	}
}

// RestartDelay is how long Start waits before starting a process that
// exited during its start again.
const RestartDelay = 500 * time.Millisecond

func (p *Process) startOnce() (*osProc, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc != nil && !p.proc.exited() {
		return nil, fmt.Errorf("chaos: process %s is running", p.Spec.Name)
	}
	args := append(append([]string(nil), p.Spec.Args...), p.Spec.URLFlag, p.URLs(p.Spec.FirstNode))
	op, err := startProc(p.Spec.Binary, args, p.Spec.Env, p.logPath, "start "+p.Spec.Name)
	if err != nil {
		return nil, err
	}
	if p.proc != nil {
		p.restarts++
	}
	p.proc, p.paused = op, false
	return op, nil
}

// Running reports whether the process is alive (paused counts).
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proc != nil && !p.proc.exited()
}

// Paused reports whether the process is stopped with SIGSTOP.
func (p *Process) Paused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused
}

// Restarts counts the starts after the first.
func (p *Process) Restarts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarts
}

// Pid is the running process's id (0 when none).
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc == nil || p.proc.exited() {
		return 0
	}
	return p.proc.Pid()
}

// Kill sends SIGKILL and waits for the exit.
func (p *Process) Kill() {
	p.mu.Lock()
	op := p.proc
	p.paused = false
	p.mu.Unlock()
	if op != nil {
		op.kill()
	}
}

// Terminate stops the process the way an operator does (SIGTERM: a drain),
// killing it after grace.
func (p *Process) Terminate(grace time.Duration) {
	p.mu.Lock()
	op := p.proc
	p.paused = false
	p.mu.Unlock()
	if op != nil {
		op.terminate(grace)
	}
}

// Pause stops the process with SIGSTOP.
func (p *Process) Pause() error { return p.signalPaused(syscall.SIGSTOP, true) }

// Resume continues a paused process with SIGCONT.
func (p *Process) Resume() error { return p.signalPaused(syscall.SIGCONT, false) }

func (p *Process) signalPaused(sig syscall.Signal, paused bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc == nil || p.proc.exited() {
		return fmt.Errorf("chaos: process %s is not running", p.Spec.Name)
	}
	if err := p.proc.signal(sig); err != nil {
		return err
	}
	p.paused = paused
	return nil
}

// Output is what the current run of the process printed so far (bounded).
func (p *Process) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc == nil {
		return ""
	}
	return p.proc.output()
}
