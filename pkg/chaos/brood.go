package chaos

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// BroodConfig is the Brood deployment a chaos run starts on a Cluster: real
// `brood` processes, each with its own endpoint, every stream and bucket R3
// (`--replicas 3`, as deploy/README.md runs them).
type BroodConfig struct {
	// Binary is the brood binary (Build). Required.
	Binary string
	// Coordinators (2) and SpawnWorkers (2) are the processes started (a
	// negative number starts none); ForkWorkers (0) adds fork-worker processes.
	Coordinators int
	SpawnWorkers int
	ForkWorkers  int
	// SiteSpawnWorkers (0) adds spawn-worker processes at the site
	// (ClusterConfig.Site): connected to the site's leaf node only, with
	// --js-domain HubDomain (deploy/README.md, "Sites").
	SiteSpawnWorkers int
	// Heartbeat and HostExpiry of every process (default
	// protocol.DefaultHeartbeatInterval and DefaultHostExpiry).
	Heartbeat  time.Duration
	HostExpiry time.Duration
	// DrainGrace of the workers (10 s, the default).
	DrainGrace time.Duration
	// LiveChildrenMax of the coordinators (0: their default, 64).
	LiveChildrenMax int
	// RequestTimeout of the coordinators (--request-timeout; 0: their
	// default, protocol.RequestTimeout): how long a child's request waits
	// for its answer before it is timed-out.
	RequestTimeout time.Duration
	// ContinueWaitMax of the coordinators (--continue-wait-max; 0: their
	// default, 30 s): how long a one-shot run whose host died waits for an
	// instance to continue it before it ends HOST_LOST.
	ContinueWaitMax time.Duration
	// WorkspaceRoot is the workers' --workspace-root: the directory the
	// children's workspace tools (write_file, run_command ...) may work in
	// ("": none, and those tools refuse every session).
	WorkspaceRoot string
	// LogLevel of the processes ("info").
	LogLevel string
	// StartTimeout bounds each process's start (30 s).
	StartTimeout time.Duration
}

// Brood is a running deployment: its processes by role.
type Brood struct {
	Coordinators []*Process
	Workers      []*Process
}

// All returns every process of the deployment.
func (b *Brood) All() []*Process {
	return append(append([]*Process(nil), b.Coordinators...), b.Workers...)
}

// StartBrood provisions Brood's R3 streams and buckets (`brood provision
// --replicas 3`, the admin step), then starts the deployment's processes,
// spreading their preferred nodes over the cluster.
func (c *Cluster) StartBrood(ctx context.Context, cfg BroodConfig) (*Brood, error) {
	if cfg.Binary == "" {
		return nil, fmt.Errorf("chaos: BroodConfig.Binary is required")
	}
	if cfg.Coordinators == 0 {
		cfg.Coordinators = 2
	}
	if cfg.SpawnWorkers == 0 {
		cfg.SpawnWorkers = 2
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = protocol.DefaultHeartbeatInterval
	}
	if cfg.HostExpiry <= 0 {
		cfg.HostExpiry = protocol.DefaultHostExpiry
	}
	if cfg.DrainGrace <= 0 {
		cfg.DrainGrace = 10 * time.Second
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "info"
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	if err := c.provision(ctx, cfg.Binary, cfg.StartTimeout); err != nil {
		return nil, err
	}
	common := []string{"--replicas", "3", "--log-level", cfg.LogLevel,
		"--heartbeat", cfg.Heartbeat.String(), "--host-expiry", cfg.HostExpiry.String()}
	var workspace []string
	if cfg.WorkspaceRoot != "" {
		workspace = []string{"--workspace-root", cfg.WorkspaceRoot}
	}
	var specs []ProcessSpec
	next := 0
	add := func(name, ready string, args ...string) {
		specs = append(specs, ProcessSpec{
			Name: name, Binary: cfg.Binary, Args: append(args, common...), FirstNode: next % len(c.nodes), ReadyLine: ready,
		})
		next++
	}
	for i := 1; i <= cfg.SiteSpawnWorkers; i++ {
		specs = append(specs, ProcessSpec{
			Name: fmt.Sprintf("site-spawn-worker-%d", i), Binary: cfg.Binary, ReadyLine: "host serving", AtSite: true,
			Args: append(append([]string{"spawn-worker", "--model", "scripted", "--drain-grace", cfg.DrainGrace.String(), "--js-domain", HubDomain}, workspace...), common...),
		})
	}
	for i := 1; i <= max(cfg.Coordinators, 0); i++ {
		args := []string{"coordinator"}
		if cfg.LiveChildrenMax > 0 {
			args = append(args, "--live-children-max", strconv.Itoa(cfg.LiveChildrenMax))
		}
		if cfg.RequestTimeout > 0 {
			args = append(args, "--request-timeout", cfg.RequestTimeout.String())
		}
		if cfg.ContinueWaitMax != 0 {
			args = append(args, "--continue-wait-max", cfg.ContinueWaitMax.String())
		}
		add(fmt.Sprintf("coordinator-%d", i), "coordinator serving", args...)
	}
	worker := func(kind string, n int) {
		for i := 1; i <= max(n, 0); i++ {
			add(fmt.Sprintf("%s-%d", kind, i), "host serving", append([]string{kind, "--model", "scripted", "--drain-grace", cfg.DrainGrace.String()}, workspace...)...)
		}
	}
	worker("spawn-worker", cfg.SpawnWorkers)
	worker("fork-worker", cfg.ForkWorkers)

	b := &Brood{}
	start := func(s ProcessSpec) error {
		sctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
		defer cancel()
		p, err := c.StartProcess(sctx, s)
		if err != nil {
			return err
		}
		if s.Args[0] == "coordinator" {
			b.Coordinators = append(b.Coordinators, p)
		} else {
			b.Workers = append(b.Workers, p)
		}
		return nil
	}
	for _, s := range specs {
		if err := start(s); err != nil {
			return b, err
		}
	}
	return b, nil
}

// provision runs `brood provision --replicas 3` against every node directly
// (not through a proxy: it is the operator's step before the deployment).
func (c *Cluster) provision(ctx context.Context, binary string, timeout time.Duration) error {
	var urls []string
	for _, n := range c.nodes {
		urls = append(urls, "nats://"+n.ClientAddr())
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := exec.CommandContext(pctx, binary, "provision", "--replicas", "3", "--timeout", timeout.String(),
		"--nats", strings.Join(urls, ",")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("chaos: brood provision: %v: %s", err, out)
	}
	return nil
}
