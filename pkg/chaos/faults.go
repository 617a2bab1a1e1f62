package chaos

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Fault classes of the schedule (the point 3; RELIABILITY.md's table).
const (
	// FaultKillServer: kill -9 of a node, then its restart. The class names
	// the node's sync mode: "kill-server/sync-always" for a node started
	// with sync_interval: always, "kill-server/sync-2m" for the default.
	FaultKillServer = "kill-server"
	// FaultKillLeader: kill -9 of the node that leads the workload's
	// provider's log or inbox stream (BROOD_LOG_spawn, BROOD_INBOX_spawn),
	// the runs bucket or the agents bucket, then its restart.
	FaultKillLeader = "kill-leader"
	// FaultStepDown: the leader of one of those steps down.
	FaultStepDown = "stepdown"
	// FaultIsolate: one node's routes drop or are cut; the processes
	// connected to it stay with it (a minority/majority split).
	FaultIsolate = "isolate"
	// FaultUnreachable: one node cut off from the other nodes and from every
	// client, which reconnect to the majority.
	FaultUnreachable = "unreachable"
	// FaultClientCut: one process or workload client cut (or its packets
	// dropped) from the node it is connected to.
	FaultClientCut = "client-cut"
	// FaultDelay: latency on every route.
	FaultDelay = "delay"
	// FaultKillCoordinator, FaultKillWorker: kill -9 of a Brood process,
	// then its restart.
	FaultKillCoordinator = "kill-coordinator"
	FaultKillWorker      = "kill-worker"
	// FaultPauseWorker: SIGSTOP of a worker past the host expiry, then SIGCONT.
	FaultPauseWorker = "pause-worker"
	// FaultSiteCut: the site's links to every node cut (or their packets
	// dropped), for less or more than the host expiry (issue 36; a cluster
	// with a site, ClusterConfig.Site).
	FaultSiteCut = "site-cut"
	// FaultSiteSlow: latency on the site's links.
	FaultSiteSlow = "site-slow"
)

// SiteFaultClasses are the classes of a cluster with a site: the site's
// links' first (a short seed reaches them), then every other class.
var SiteFaultClasses = append([]string{FaultSiteCut, FaultSiteSlow}, FaultClasses...)

// FaultClasses lists every class, in the order the schedule first visits them.
var FaultClasses = []string{
	FaultKillLeader, FaultIsolate, FaultKillWorker, FaultStepDown, FaultClientCut, FaultKillCoordinator,
	FaultKillServer, FaultPauseWorker, FaultUnreachable, FaultDelay,
}

// leaderStreams are the streams whose leaders the schedule kills and steps
// down: the log and inbox streams of the workload's children (provider
// spawn, Config.Provider's default; each scope has its own, store's
// streams.go) and the runs and agents buckets.
var leaderStreams = []string{"BROOD_LOG_spawn", "BROOD_INBOX_spawn", "KV_brood_runs", "KV_brood_agents"}

// Step is one fault of a schedule: after Gap (from the previous heal), the
// fault is held for Hold, then healed. Pick chooses among targets, Mode
// among link modes, Delay is the latency of a delay fault.
type Step struct {
	Gap   time.Duration
	Class string
	Hold  time.Duration
	Pick  int
	Mode  LinkMode
	Delay time.Duration
}

func (s Step) String() string {
	extra := ""
	switch s.Class {
	case FaultIsolate, FaultUnreachable, FaultClientCut, FaultSiteCut:
		extra = " " + s.Mode.String()
	case FaultDelay, FaultSiteSlow:
		extra = " " + s.Delay.String()
	}
	return fmt.Sprintf("after %s %s#%d%s for %s", s.Gap, s.Class, s.Pick, extra, s.Hold)
}

// ScheduleConfig shapes a fault schedule.
type ScheduleConfig struct {
	Seed     int64
	Duration time.Duration
	// Classes to draw from (FaultClasses); every class comes once, in a
	// seeded order, before any comes again.
	Classes []string
	// HostExpiry of the deployment: a pause lasts past it.
	HostExpiry time.Duration
	// HoldMax bounds how long a fault lasts (8 s); GapMax the quiet between
	// faults (4 s).
	HoldMax time.Duration
	GapMax  time.Duration
}

// NewSchedule draws the fault schedule of a seed: the same seed and config
// give the same steps. Successive kills of a leader and stepdowns take the
// streams of leaderStreams in turn, successive kills of a node the nodes in
// turn, starting from a seeded one.
func NewSchedule(cfg ScheduleConfig) []Step {
	if len(cfg.Classes) == 0 {
		cfg.Classes = FaultClasses
	}
	if cfg.HoldMax <= 0 {
		cfg.HoldMax = 8 * time.Second
	}
	if cfg.GapMax <= 0 {
		cfg.GapMax = 4 * time.Second
	}
	if cfg.HostExpiry <= 0 {
		cfg.HostExpiry = protocol.DefaultHostExpiry
	}
	rng := rand.New(rand.NewSource(cfg.Seed))
	// Classes whose targets cycle rather than being drawn each time.
	cycles := map[string]bool{FaultKillLeader: true, FaultStepDown: true, FaultKillServer: true}
	firstPick, nth := map[string]int{}, map[string]int{}
	var steps []Step
	var total time.Duration
	var order []string
	for total < cfg.Duration {
		if len(order) == 0 {
			order = append([]string(nil), cfg.Classes...)
			if len(steps) > 0 { // the first round keeps the listed order's start
				rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			}
		}
		s := Step{Class: order[0], Pick: rng.Intn(1 << 20)}
		order = order[1:]
		if cycles[s.Class] {
			// The n-th fault of the class takes the next target after the
			// first one's: the four streams' leaders and the three nodes
			// (sync always and the default) each get their turn.
			if first, ok := firstPick[s.Class]; ok {
				s.Pick = first + nth[s.Class]
			} else {
				firstPick[s.Class] = s.Pick
			}
			nth[s.Class]++
		}
		s.Gap = time.Second + time.Duration(rng.Int63n(int64(cfg.GapMax)))
		s.Hold = 2*time.Second + time.Duration(rng.Int63n(int64(cfg.HoldMax-2*time.Second)+1))
		s.Mode = Drop
		if rng.Intn(2) == 0 {
			s.Mode = Cut
		}
		switch s.Class {
		case FaultPauseWorker:
			s.Hold = cfg.HostExpiry + time.Second + time.Duration(rng.Int63n(int64(3*time.Second)))
		case FaultStepDown:
			s.Hold = 0
		case FaultDelay:
			s.Delay = time.Duration(20+rng.Intn(180)) * time.Millisecond
		case FaultSiteSlow:
			s.Delay = time.Duration(50+rng.Intn(450)) * time.Millisecond
		}
		steps = append(steps, s)
		total += s.Gap + s.Hold
	}
	return steps
}

// Nemesis injects a schedule's faults into a cluster and its Brood
// deployment, one at a time, recording each from its start to its heal.
type Nemesis struct {
	c       *Cluster
	b       *Brood
	clients []*Endpoint
	rec     *Recorder
	logf    func(format string, args ...any)
}

// NewNemesis returns a nemesis for cluster c, deployment b and the
// workload's client endpoints.
func NewNemesis(c *Cluster, b *Brood, clients []*Endpoint, rec *Recorder, logf func(string, ...any)) *Nemesis {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	return &Nemesis{c: c, b: b, clients: clients, rec: rec, logf: logf}
}

// Run injects steps until they run out or ctx ends, and heals everything
// before it returns (restarting what is down).
func (n *Nemesis) Run(ctx context.Context, steps []Step) {
	defer n.HealAll(context.Background())
	for _, s := range steps {
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.Gap):
		}
		n.apply(ctx, s)
	}
}

// HealAll heals every link and starts every node and process that is down.
func (n *Nemesis) HealAll(ctx context.Context) {
	n.c.HealAll()
	for _, node := range n.c.Nodes() {
		if node.Paused() {
			_ = node.Resume()
		}
		if !node.Running() {
			if err := node.Restart(ctx); err != nil {
				n.logf("nemesis: restart %s: %v", node.Name, err)
			}
		}
	}
	for _, p := range n.b.All() {
		if p.Paused() {
			_ = p.Resume()
		}
		if !p.Running() {
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			if err := p.Start(sctx); err != nil {
				n.logf("nemesis: restart %s: %v", p.Spec.Name, err)
			}
			cancel()
		}
	}
}

func pick[T any](xs []T, i int) T { return xs[i%len(xs)] }

// hold waits d or until ctx ends.
func hold(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (n *Nemesis) apply(ctx context.Context, s Step) {
	start := time.Now()
	rec := FaultRecord{Class: s.Class, Start: start.UnixMilli()}
	heal := func() {}
	switch s.Class {
	case FaultKillServer, FaultKillLeader:
		node := pick(n.c.Nodes(), s.Pick)
		if s.Class == FaultKillLeader {
			stream := pick(leaderStreams, s.Pick)
			if l := n.c.StreamLeader(ctx, stream); l != nil {
				node = l
			}
			rec.Target = stream + "@" + node.Name
		} else {
			rec.Target = node.Name
		}
		rec.Class = s.Class + syncClass(node)
		node.Kill()
		heal = func() {
			if err := node.Restart(context.Background()); err != nil {
				n.logf("nemesis: restart %s: %v", node.Name, err)
			}
		}
	case FaultStepDown:
		stream := pick(leaderStreams, s.Pick)
		rec.Target = stream
		if l := n.c.StreamLeader(ctx, stream); l != nil {
			rec.Target += "@" + l.Name
		}
		if err := n.c.StepDown(ctx, stream); err != nil {
			rec.Note = err.Error()
		}
		// The election that follows is the fault: it lasts until a
		// leader is known again (bounded).
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) && n.c.StreamLeader(ctx, stream) == nil {
			hold(ctx, 100*time.Millisecond)
		}
	case FaultIsolate:
		node := pick(n.c.Nodes(), s.Pick)
		if s.Pick%3 == 0 { // sometimes the node that leads the inbox
			if l := n.c.StreamLeader(ctx, "BROOD_INBOX_spawn"); l != nil {
				node = l
			}
		}
		rec.Target = node.Name + " " + s.Mode.String()
		n.c.Isolate(node.Index, s.Mode)
		heal = n.c.HealRoutes
	case FaultUnreachable:
		node := pick(n.c.Nodes(), s.Pick)
		rec.Target = node.Name + " " + s.Mode.String()
		n.c.Unreachable(node.Index, s.Mode)
		heal = n.c.HealAll
	case FaultClientCut:
		eps := append([]*Endpoint(nil), n.clients...)
		for _, p := range n.b.All() {
			eps = append(eps, p.Endpoint)
		}
		ep := pick(eps, s.Pick)
		on := ep.Connected()
		node := s.Pick % len(ep.proxies)
		if len(on) > 0 {
			node = on[0]
		}
		rec.Target = ep.Proxy(node).Name() + " " + s.Mode.String()
		ep.SetNode(node, s.Mode, 0)
		heal = ep.Heal
	case FaultDelay:
		rec.Target = s.Delay.String()
		n.c.DelayRoutes(s.Delay)
		heal = n.c.HealRoutes
	case FaultSiteCut:
		rec.Target = "site " + s.Mode.String()
		n.c.SetSiteLinks(s.Mode, 0)
		heal = func() { n.c.SetSiteLinks(Pass, 0) }
	case FaultSiteSlow:
		rec.Target = "site " + s.Delay.String()
		n.c.SetSiteLinks(Pass, s.Delay)
		heal = func() { n.c.SetSiteLinks(Pass, 0) }
	case FaultKillCoordinator, FaultKillWorker:
		procs := n.b.Coordinators
		if s.Class == FaultKillWorker {
			procs = n.b.Workers
		}
		p := pick(procs, s.Pick)
		rec.Target = p.Spec.Name
		p.Kill()
		heal = func() {
			sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := p.Start(sctx); err != nil {
				n.logf("nemesis: restart %s: %v", p.Spec.Name, err)
			}
		}
	case FaultPauseWorker:
		p := pick(n.b.Workers, s.Pick)
		rec.Target = p.Spec.Name
		if err := p.Pause(); err != nil {
			rec.Note = err.Error()
		}
		heal = func() { _ = p.Resume() }
	}
	n.logf("nemesis: %s %s (hold %s)", rec.Class, rec.Target, s.Hold)
	hold(ctx, s.Hold)
	heal()
	rec.End = time.Now().UnixMilli()
	n.rec.Fault(rec)
}

// syncClass names a node's sync mode for the fault class.
func syncClass(n *Node) string {
	if n.SyncAlways {
		return "/sync-always"
	}
	return "/sync-2m"
}

// ClassesSeen lists the classes (without their sync suffix) of faults.
func ClassesSeen(faults []FaultRecord) map[string]bool {
	out := map[string]bool{}
	for _, f := range faults {
		base, _, _ := strings.Cut(f.Class, "/")
		out[base] = true
	}
	return out
}
