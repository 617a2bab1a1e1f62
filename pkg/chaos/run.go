package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// RunConfig configures one chaos run: a cluster, a Brood deployment, the
// seeded workload and fault schedule, then the check.
type RunConfig struct {
	// Dir holds the cluster's stores and every log. Required.
	Dir string
	// Brood is the brood binary (Build). Required. ServiceBinary, when
	// set, runs the coordinators and workers instead (a build with -race);
	// the nodes always run Brood.
	Brood         string
	ServiceBinary string
	Seed          int64
	// Duration of the workload under faults (the heal, the last messages and
	// the check come after it).
	Duration time.Duration
	// Classes of faults to draw from (FaultClasses).
	Classes []string
	// Clients of the workload (4).
	Clients int
	// Provider of the workload's children ("spawn"). Workers, when given,
	// are the processes that serve it (your provider's workers: the
	// nemesis kills and pauses them like Brood's); otherwise two Brood
	// spawn workers do.
	Provider string
	Workers  []ProcessSpec
	// Heartbeat and HostExpiry of every Brood process (500 ms, 3 s).
	Heartbeat  time.Duration
	HostExpiry time.Duration
	// LiveChildrenMax of the coordinators (10).
	LiveChildrenMax int
	// RequestTimeout of the coordinators (8 s): a request the workload
	// leaves unanswered times out within the run.
	RequestTimeout time.Duration
	// ContinueWaitMax of the coordinators (5 s): a one-shot run whose host
	// died and that no instance continues ends HOST_LOST well within I6's
	// grace.
	ContinueWaitMax time.Duration
	// Bounds the checker holds Brood to (DefaultBounds).
	Bounds Bounds
	// FaultHoldMax, FaultGapMax shape the schedule (8 s, 4 s).
	FaultHoldMax time.Duration
	FaultGapMax  time.Duration
	// ContinuableBudgets gives continuable starts budgets too
	// (WorkloadConfig.ContinuableBudgets): make chaos, not the short seed.
	ContinuableBudgets bool
	// Site runs the topology with a site (ClusterConfig.Site; issue 36):
	// one of the two spawn workers is the site's, behind its leaf node,
	// and the schedule draws from SiteFaultClasses unless Classes is set.
	Site bool
	// HistoryPath, when set, receives the history as gzipped JSON.
	HistoryPath string
	Logf        func(format string, args ...any)
}

// DefaultBounds are the bounds of RELIABILITY.md, for a deployment with
// the given host expiry.
func DefaultBounds(hostExpiry time.Duration) Bounds {
	return Bounds{HostExpiry: hostExpiry, Grace: 20 * time.Second, Cascade: 30 * time.Second, Process: 60 * time.Second}
}

// Result is a finished run: its history and the checker's report.
type Result struct {
	History  *History
	Report   *Report
	Schedule []Step
	// Crashes lists the lines of the processes' logs that say a process
	// crashed on its own (a panic, a fatal error, a data race): the nemesis
	// only kills with SIGKILL, which leaves no such line.
	Crashes []string
}

// RunChaos runs one seed end to end and checks it. It returns an error
// only when the harness itself failed (a cluster that would not start, a
// snapshot that could not be read); invariant violations are in the report.
func RunChaos(ctx context.Context, cfg RunConfig) (*Result, error) {
	if cfg.Dir == "" || cfg.Brood == "" {
		return nil, fmt.Errorf("chaos: RunConfig.Dir and Brood are required")
	}
	if cfg.Clients <= 0 {
		cfg.Clients = 4
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 500 * time.Millisecond
	}
	if cfg.HostExpiry <= 0 {
		cfg.HostExpiry = 3 * time.Second
	}
	if cfg.LiveChildrenMax <= 0 {
		cfg.LiveChildrenMax = 10
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 8 * time.Second
	}
	if cfg.ContinueWaitMax == 0 {
		cfg.ContinueWaitMax = 5 * time.Second
	}
	if cfg.Bounds == (Bounds{}) {
		cfg.Bounds = DefaultBounds(cfg.HostExpiry)
	}
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	c, err := StartCluster(ctx, ClusterConfig{
		Dir: cfg.Dir, ServerCommand: ServerCommand(cfg.Brood), SyncAlways: []int{2}, Logf: logf, Site: cfg.Site,
	})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if cfg.Provider == "" {
		cfg.Provider = "spawn"
	}
	spawnWorkers, siteWorkers := 0, 0
	if len(cfg.Workers) > 0 {
		spawnWorkers = -1
	}
	if cfg.Site {
		if len(cfg.Workers) > 0 || cfg.Provider != "spawn" {
			return nil, fmt.Errorf("chaos: RunConfig.Site runs Brood's spawn workers, not Workers")
		}
		spawnWorkers, siteWorkers = 1, 1
		if len(cfg.Classes) == 0 {
			cfg.Classes = SiteFaultClasses
		}
	}
	services := cfg.Brood
	if cfg.ServiceBinary != "" {
		services = cfg.ServiceBinary
	}
	// Every root works in cwd, the workers' workspace root: the side
	// effects of approved calls land there (RanFile, WriteDir).
	cwd := filepath.Join(cfg.Dir, "workspace")
	if err := os.MkdirAll(cwd, 0o755); err != nil {
		return nil, err
	}
	b, err := c.StartBrood(ctx, BroodConfig{
		Binary: services, Heartbeat: cfg.Heartbeat, HostExpiry: cfg.HostExpiry, DrainGrace: 2 * time.Second,
		LiveChildrenMax: cfg.LiveChildrenMax, SpawnWorkers: spawnWorkers, SiteSpawnWorkers: siteWorkers,
		RequestTimeout: cfg.RequestTimeout, ContinueWaitMax: cfg.ContinueWaitMax, WorkspaceRoot: cwd,
	})
	if err != nil {
		return nil, err
	}
	for _, spec := range cfg.Workers {
		p, err := c.StartProcess(ctx, spec)
		if err != nil {
			return nil, err
		}
		b.Workers = append(b.Workers, p)
	}
	observer, err := connectDirect(c)
	if err != nil {
		return nil, err
	}
	defer observer.Close()
	if err := waitProviders(ctx, observer, cfg.Provider, len(b.Workers)); err != nil {
		return nil, err
	}
	rec := NewRecorder()
	wl, err := NewWorkload(c, rec, WorkloadConfig{
		Seed: cfg.Seed, Clients: cfg.Clients, Provider: cfg.Provider, LiveChildrenMax: cfg.LiveChildrenMax, Cwd: cwd, Logf: logf,
		ContinuableBudgets: cfg.ContinuableBudgets,
	})
	if err != nil {
		return nil, err
	}
	defer wl.Close()
	steps := NewSchedule(ScheduleConfig{
		Seed: cfg.Seed, Duration: cfg.Duration, Classes: cfg.Classes, HostExpiry: cfg.HostExpiry,
		HoldMax: cfg.FaultHoldMax, GapMax: cfg.FaultGapMax,
	})
	var plan []string
	for _, s := range steps {
		plan = append(plan, s.String())
	}
	logf("seed %d: schedule: %s", cfg.Seed, strings.Join(plan, "; "))

	start := time.Now()
	nemesis := NewNemesis(c, b, wl.Endpoints(), rec, logf)
	wctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	nemDone := make(chan struct{})
	go func() {
		defer close(nemDone)
		nemesis.Run(wctx, steps)
	}()
	wl.Run(wctx)
	<-nemDone
	healed := time.Now()
	logf("seed %d: workload and faults done after %s; healing", cfg.Seed, healed.Sub(start).Round(time.Second))
	hctx, hcancel := context.WithTimeout(ctx, 2*time.Minute)
	err = waitHealthy(hctx, c)
	hcancel()
	if err != nil {
		return nil, err
	}
	stopAnswers := wl.AnswerPending(ctx)
	wl.Finish(ctx)
	logf("seed %d: last messages sent after %s; waiting for quiet", cfg.Seed, time.Since(start).Round(time.Second))
	st, err := store.Bind(ctx, observer, protocol.MustSubjects(""))
	if err != nil {
		stopAnswers()
		return nil, err
	}
	// The pending requests are answered until the stores are quiet. An
	// answer that completed after the last snapshot began may not be in
	// it (its record there pending while the op says taken): then the
	// wait is read again, still answering (at most quietRoundsMax times).
	var snap *Snapshot
	for round := 1; ; round++ {
		snap, err = quiesce(ctx, st, wl.Roots(), cfg.Bounds.Process)
		last := stopAnswers()
		if err != nil {
			return nil, err
		}
		if last < snap.TakenAt || round == quietRoundsMax {
			break
		}
		stopAnswers = wl.AnswerPending(ctx)
	}
	ws, err := readWorkspace(cwd)
	if err != nil {
		return nil, err
	}
	h := &History{
		Seed: cfg.Seed, Bounds: cfg.Bounds, Limits: Limits{LiveChildrenMax: cfg.LiveChildrenMax, DepthMax: 3},
		Start: start.UnixMilli(), Healed: healed.UnixMilli(), Ops: rec.Ops(), Faults: rec.Faults(), Snapshot: snap, Workspace: ws,
	}
	wl.CloseRoots(ctx)
	if cfg.HistoryPath != "" {
		if err := h.Save(cfg.HistoryPath); err != nil {
			return nil, err
		}
	}
	return &Result{History: h, Report: Check(h), Schedule: steps, Crashes: crashes(c)}, nil
}

// workspaceBytesMax bounds what readWorkspace reads of the workspace.
const workspaceBytesMax = 16 << 20

// readWorkspace reads the workload's side effects in the workspace dir:
// RanFile and the files of WriteDir, by path relative to dir (every
// directory but WriteDir is left alone: none of the workload's).
func readWorkspace(dir string) (map[string]string, error) {
	out := map[string]string{}
	total := 0
	read := func(rel string) error {
		b, err := os.ReadFile(filepath.Join(dir, rel))
		if err != nil {
			return err
		}
		if total += len(b); total > workspaceBytesMax {
			return fmt.Errorf("chaos: the workspace %s holds more than %d bytes", dir, workspaceBytesMax)
		}
		out[rel] = string(b)
		return nil
	}
	if err := read(RanFile); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	entries, err := os.ReadDir(filepath.Join(dir, WriteDir))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	for _, e := range entries {
		if e.Type().IsRegular() {
			if err := read(WriteDir + "/" + e.Name()); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// crashMarks are what Go prints when a process dies of a bug.
var crashMarks = []string{"panic: ", "fatal error: ", "WARNING: DATA RACE"}

// crashes scans every process's and node's log for crashMarks.
func crashes(c *Cluster) []string {
	var logs []string
	for _, p := range c.Processes() {
		logs = append(logs, p.LogPath())
	}
	for _, n := range c.Nodes() {
		logs = append(logs, n.logPath)
	}
	var out []string
	for _, path := range logs {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			for _, m := range crashMarks {
				if strings.Contains(line, m) {
					out = append(out, filepath.Base(path)+": "+line)
				}
			}
		}
	}
	return out
}

// connectDirect connects the harness's observer to the nodes themselves,
// around the proxies.
func connectDirect(c *Cluster) (*nats.Conn, error) {
	var urls []string
	for _, n := range c.Nodes() {
		urls = append(urls, n.ClientURL())
	}
	return nats.Connect(strings.Join(urls, ","), nats.Name("chaos-observer"), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.Timeout(5*time.Second))
}

func waitProviders(ctx context.Context, nc *nats.Conn, provider string, n int) error {
	cl, err := client.New(nc, client.Options{})
	if err != nil {
		return err
	}
	defer cl.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		r, err := cl.Providers(pctx)
		cancel()
		if err == nil && r.Instances[provider] >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: provider %s not listed with %d instances within a minute (%w)", provider, n, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitHealthy waits until the meta group and every Brood stream and bucket
// have a leader with every replica current.
func waitHealthy(ctx context.Context, c *Cluster) error {
	if err := c.WaitMetaLeader(ctx); err != nil {
		return err
	}
	streams := append([]string{"BROOD_SESSIONS", "BROOD_EVENTS", "KV_brood_hosts", "BROOD_LOG_root", "BROOD_INBOX_root"}, leaderStreams...)
	for _, s := range streams {
		for !c.StreamCurrent(ctx, s) {
			select {
			case <-ctx.Done():
				return fmt.Errorf("chaos: stream %s not current after the heal: %w", s, ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

// quietRoundsMax bounds the waits for quiet while the workload answers
// the pending requests (RunChaos).
const quietRoundsMax = 3

// quiesce waits, up to bound, until two snapshots in a row are quiet (no
// run or epoch record running, no inbox but a root's holding an item) and
// hold the same state (settled), and returns the last one; past bound, the
// last snapshot read. One quiet snapshot is not enough: a snapshot reads
// the logs, the lifecycle events, the inboxes and the records one after
// the other, so an epoch that claims an item after its log was read and
// settles before its record is read looks quiet with its turn open, its
// subagent/end missing and its item in neither its log nor its inbox (the
// checker reported such a message lost and its turn never ended, although
// the stores held both, ended).
func quiesce(ctx context.Context, st *store.Store, roots map[string]bool, bound time.Duration) (*Snapshot, error) {
	deadline := time.Now().Add(bound)
	var prev *Snapshot // the last snapshot, when it was quiet
	for {
		snap, err := takeSnapshotRetrying(ctx, st)
		if err != nil {
			return nil, err
		}
		if settled(prev, snap, roots) || time.Now().After(deadline) {
			return snap, nil
		}
		prev = nil
		if quiet(snap, roots) {
			prev = snap
		}
		select {
		case <-ctx.Done():
			return snap, nil
		case <-time.After(2 * time.Second):
		}
	}
}

// settled reports whether snapshot b, read after a, ends the wait: both
// are quiet and nothing changed between them (every log, the lifecycle
// events, every inbox and every record's state are as they were).
func settled(a, b *Snapshot, roots map[string]bool) bool {
	if a == nil || !quiet(a, roots) || !quiet(b, roots) {
		return false
	}
	if len(a.Logs) != len(b.Logs) || len(a.Lifecycle) != len(b.Lifecycle) ||
		len(a.Inbox) != len(b.Inbox) || len(a.Runs) != len(b.Runs) {
		return false
	}
	for id, evs := range a.Logs {
		if len(b.Logs[id]) != len(evs) {
			return false
		}
	}
	for id, items := range a.Inbox {
		if len(b.Inbox[id]) != len(items) {
			return false
		}
	}
	for id, r := range a.Runs {
		if o, ok := b.Runs[id]; !ok || o.State != r.State {
			return false
		}
	}
	return true
}

// takeSnapshotRetrying reads a snapshot, trying again (for up to a minute)
// after a transient JetStream error.
func takeSnapshotRetrying(ctx context.Context, st *store.Store) (*Snapshot, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		snap, err := takeSnapshot(ctx, st)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return snap, err
		}
		time.Sleep(time.Second)
	}
}

func quiet(s *Snapshot, roots map[string]bool) bool {
	ended := map[string]bool{} // one-shot sessions that settled
	for _, r := range s.Runs {
		if r.State != protocol.RunSettled {
			return false
		}
		if r.Mode == protocol.ModeOneShot {
			ended[r.ChildID] = true
		}
	}
	for id, items := range s.Inbox {
		if roots[id] {
			continue
		}
		for _, it := range items {
			notice := it.Source.Kind == protocol.SourceSubagentSettled || it.Source.Kind == protocol.SourceSubagentReport
			if !(notice && ended[id]) {
				return false
			}
		}
	}
	return true
}
