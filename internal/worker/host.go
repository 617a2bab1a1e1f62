// Package worker is what every provider worker shares (docs/design.md §2): the
// host identity and its heartbeat in brood_hosts, the provider micro services
// on `<prefix>.v1.provider.<name>.<op>`, the host's own subjects
// `<prefix>.v1.host.<hostId>.<op>`, and the hosting of runs: lease, log,
// settlement, notify, lifecycle events, dispose, drain.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/oklog/ulid/v2"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/buildinfo"
	"github.com/brood-dev/brood/internal/gopool"
	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/provider/contract"
)

// The session contract is the provider SDK's (pkg/provider/contract, a leaf
// that providers outside the module import too): the host drives these very
// types, and what each promises is said there.
type (
	// Session is a hosted child as the host drives it: an *agent.Agent, or a
	// provider's own implementation (the ACP bridge) that logs the same way.
	Session = contract.Session
	// Preparer is implemented by providers with a creation spec (seed:
	// prepareContinuable): the coordinator asks it before writing a child's
	// header, whose seedLength records the answer.
	Preparer = contract.Preparer
	// Closer is implemented by sessions that hold resources beyond their
	// turn (an ACP agent process): the host calls Close once the run
	// settled or was dropped.
	Closer = contract.Closer
	// SessionSpec is what a provider needs to compose one child session.
	SessionSpec = contract.SessionSpec
	// ContinuableSession is a session that can host a continuable child's
	// activation: it claims its turns from the inbox (*agent.Agent).
	ContinuableSession = contract.ContinuableSession
	// ParkedSession is a ContinuableSession that continues a turn its log
	// left parked on a request (*agent.Agent).
	ParkedSession = contract.ParkedSession
	// ContinuingSession continues a one-shot run's turn its dead host left
	// open (contract.ContinuingSession).
	ContinuingSession = contract.ContinuingSession
	// Provider is one provider a host serves.
	Provider = contract.Provider
)

// Config configures a Host. Zero durations take the defaults of docs/design.md §4.
type Config struct {
	NC        *nats.Conn
	Store     *store.Store
	Providers []Provider
	// Scope is the first token of the host id (protocol.WorkerHostID), of
	// its host subjects and of its brood_hosts key: the name of the one
	// provider it serves (the default then), or protocol.HostScopeShared
	// (the default with several providers). A deployment with users lets a
	// provider's worker user write and serve only its own scope
	// (docs/security.md).
	Scope string
	// HostID is the unique part of the host id <Scope>.<HostID>, a
	// protocol.ValidID; default a new ULID.
	HostID string
	// HeartbeatInterval is how often the host record is rewritten
	// (protocol.DefaultHeartbeatInterval, 1 s).
	HeartbeatInterval time.Duration
	// HostExpiry is how old a heartbeat may be before the host counts as
	// dead (protocol.DefaultHostExpiry, 5 s).
	HostExpiry time.Duration
	// DrainGrace is how long a stopping host lets in-flight turns finish
	// before disposing them (DefaultDrainGrace, 10 s).
	DrainGrace time.Duration
	// RequestsInFlightMax bounds concurrently handled requests (1024).
	RequestsInFlightMax int
	// Version is reported by the micro services.
	Version string
	Logger  *slog.Logger
	// Metrics, when set, counts the runs and epochs this host settles and its
	// requests, and reports its live runs and activations.
	Metrics *telemetry.Metrics
	// Stopped, when set, is called once Run returns (after the drain): it
	// stops what the host's providers started with it (their MCP servers).
	Stopped func()
}

// DefaultDrainGrace is how long a stopping host lets in-flight turns finish
// unless Config.DrainGrace says otherwise.
const DefaultDrainGrace = 10 * time.Second

// Host is one provider worker process.
type Host struct {
	cfg  Config
	subj protocol.Subjects
	st   *store.Store
	log  *slog.Logger
	id   string

	mu       sync.Mutex
	runs     map[string]*hostedRun  // by run id
	acts     map[string]*activation // by child id
	draining bool
	started  int64

	unsettled unsettled // settlements whose budget ran out (claim.go)

	// turns runs each hosted one-shot run's turn (execute) on a reused
	// goroutine, whose stack has grown already: a fresh one's growth was
	// 18 µs of the worker's CPU per run (BENCHMARKS.md, issue 31). Set by
	// Run before it serves; its idle goroutines end with Run's context. It
	// is not waited for: a run a drain did not end may outlive Run, as it
	// did on a goroutine of its own.
	turns *gopool.Pool
}

// New validates cfg and returns a host; Run serves it.
func New(cfg Config) (*Host, error) {
	if cfg.NC == nil || cfg.Store == nil || len(cfg.Providers) == 0 {
		return nil, errors.New("worker: NC, Store and at least one provider are required")
	}
	if cfg.HostID == "" {
		cfg.HostID = ulid.Make().String()
	}
	if !protocol.ValidID(cfg.HostID) {
		return nil, fmt.Errorf("worker: host id %q must match ^[A-Za-z0-9_-]{1,64}$", cfg.HostID)
	}
	if cfg.Scope == "" {
		cfg.Scope = protocol.HostScopeShared
		if len(cfg.Providers) == 1 {
			cfg.Scope = cfg.Providers[0].Descriptor().Name
		}
	}
	hostID := protocol.WorkerHostID(cfg.Scope, cfg.HostID)
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = protocol.DefaultHeartbeatInterval
	}
	if cfg.HostExpiry <= 0 {
		cfg.HostExpiry = protocol.DefaultHostExpiry
	}
	if cfg.DrainGrace <= 0 {
		cfg.DrainGrace = DefaultDrainGrace
	}
	if cfg.RequestsInFlightMax <= 0 {
		cfg.RequestsInFlightMax = 1024
	}
	if cfg.Version == "" {
		cfg.Version = buildinfo.Version
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	for _, p := range cfg.Providers {
		if !protocol.ValidID(p.Descriptor().Name) {
			return nil, fmt.Errorf("worker: provider name %q must match ^[A-Za-z0-9_-]{1,64}$", p.Descriptor().Name)
		}
		if p.Descriptor().Name == protocol.ScopeRoot {
			return nil, fmt.Errorf("worker: the provider name %q is reserved: it is the scope of roots' session logs", protocol.ScopeRoot)
		}
		if !protocol.MayOffer(hostID, p.Descriptor().Name) {
			return nil, fmt.Errorf("worker: a host of scope %q may serve only provider %q (or use scope %q), not %q",
				cfg.Scope, cfg.Scope, protocol.HostScopeShared, p.Descriptor().Name)
		}
	}
	var names []string
	for _, p := range cfg.Providers {
		names = append(names, p.Descriptor().Name)
	}
	subj := cfg.Store.Subj
	// Reads of its providers' records from the buckets' leaders go through
	// the coordinators (store.WithLeaderReads; docs/security.md): a leader
	// get names its key in its body, so no permission scopes it.
	st := cfg.Store.WithLeaderReads(names, func(ctx context.Context, bucket, key string) ([]byte, uint64, bool, error) {
		scope, _ := store.ScopeOfKey(key)
		var reply protocol.KVLatestReply
		if err := rpc.Call(ctx, cfg.NC, subj.KVLatest(scope, bucket), protocol.KVLatestRequest{Key: key}, &reply); err != nil {
			return nil, 0, false, err
		}
		return reply.Value, reply.Revision, reply.Found, nil
	})
	return &Host{
		cfg: cfg, subj: subj, st: st, id: hostID,
		log:  cfg.Logger.With("host", hostID),
		runs: map[string]*hostedRun{},
		acts: map[string]*activation{},
	}, nil
}

// ID returns the host id.
func (h *Host) ID() string { return h.id }

// Run registers the host, serves its providers until ctx is done, then drains:
// it stops admitting, lets in-flight turns finish within DrainGrace, disposes
// what is left, stops serving its host subjects and removes its host record.
// It returns only after every request handler it started returned. A drain
// returns nil.
func (h *Host) Run(ctx context.Context) error {
	if h.cfg.Stopped != nil {
		defer h.cfg.Stopped()
	}
	if err := h.checkDuplicates(ctx); err != nil {
		return err
	}
	h.started = store.NowMs()
	h.turns = gopool.New(ctx)
	// Answers go only to inboxes (docs/security.md, "Replies go only where
	// replies may go"): a host publishes with its provider's rights (its
	// runs' states, leases and logs), never where a request's reply
	// subject names.
	srv := rpc.NewServer(h.cfg.NC, h.cfg.RequestsInFlightMax, h.log).WithReplyPolicy(rpc.ReplyPolicy{
		Refused: func(_, reason string) { h.cfg.Metrics.ReplyRefused("worker", reason) },
	})
	stopServing := func() {
		sctx, cancel := context.WithTimeout(context.Background(), HostStopGrace)
		defer cancel()
		srv.Stop(sctx)
	}
	if err := srv.Handle(h.subj.HostAll(h.id), h.hostHandler()); err != nil {
		return err
	}
	var svcs []*rpc.Service
	for _, p := range h.cfg.Providers {
		svc, err := h.serveProvider(srv, p)
		if err != nil {
			stopServing()
			return err
		}
		svcs = append(svcs, svc)
	}
	if err := rpc.Subscribed(h.cfg.NC, SubscribeFlushTimeout); err != nil {
		stopServing()
		return fmt.Errorf("worker: subscribe: %w", err)
	}
	// The host record makes the providers visible: only once they are served.
	if err := h.firstBeat(ctx); err != nil {
		stopServing()
		if ctx.Err() != nil {
			// Stopped before it served: a drain with nothing to drain, not
			// a failure. A first beat cut off by the stop may have landed.
			dctx, cancel := context.WithTimeout(context.Background(), DeregisterTimeout)
			defer cancel()
			_ = h.st.DeleteHost(dctx, h.id)
			return nil
		}
		return fmt.Errorf("worker: first heartbeat: %w", err)
	}
	h.log.Info("host serving", "providers", h.providerNames())
	h.cfg.Metrics.Known("worker", []string{rpc.ReplyOutsideInboxes, rpc.ReplyOutsideUserInbox}, h.providerNames(), nil)
	defer h.cfg.Metrics.HostGauges(h.liveActivations, h.liveRuns)()

	beatDone := make(chan struct{})
	beatCtx, stopBeat := context.WithCancel(context.WithoutCancel(ctx))
	go func() { defer close(beatDone); h.heartbeatLoop(beatCtx) }()

	<-ctx.Done()
	h.drain(svcs)
	stopBeat()
	<-beatDone
	// The host subjects are served until the drain is over (a coordinator
	// may still ask for state or a dispose meanwhile).
	stopServing()
	dctx, cancel := context.WithTimeout(context.Background(), DeregisterTimeout)
	defer cancel()
	_ = h.st.DeleteHost(dctx, h.id)
	h.log.Info("host drained")
	return nil
}

// HostStopGrace bounds how long a drained host waits for the requests to its
// host subjects still in flight before cancelling them.
const HostStopGrace = 5 * time.Second

// DrainTeardownMax bounds how long a drain waits, for all of them together,
// for the runs and activations it disposed to stop (their teardown writes
// are bounded by 15 s each, in parallel).
const DrainTeardownMax = 20 * time.Second

// liveActivations reports the resident activations by provider
// (brood_activations_live).
func (h *Host) liveActivations(add func(v float64, labels ...string)) {
	counts := h.zeroCounts()
	for _, a := range h.snapshotActs() {
		counts[a.provider]++
	}
	for p, n := range counts {
		add(float64(n), p)
	}
}

// liveRuns reports the hosted one-shot runs by provider (brood_runs_live).
func (h *Host) liveRuns(add func(v float64, labels ...string)) {
	counts := h.zeroCounts()
	for _, r := range h.snapshotRuns() {
		counts[r.req.Provider]++
	}
	for p, n := range counts {
		add(float64(n), p)
	}
}

func (h *Host) zeroCounts() map[string]int {
	counts := map[string]int{}
	for _, name := range h.providerNames() {
		counts[name] = 0
	}
	return counts
}

// instrument counts a provider endpoint's answers and their latency.
func (h *Host) instrument(endpoint string, handle rpc.Handler) rpc.Handler {
	if h.cfg.Metrics == nil {
		return handle
	}
	return func(ctx context.Context, req rpc.Request) (any, error) {
		start := time.Now()
		reply, err := handle(ctx, req)
		h.cfg.Metrics.Request("provider", endpoint, time.Since(start), err)
		return reply, err
	}
}

func (h *Host) providerNames() []string {
	var out []string
	for _, p := range h.cfg.Providers {
		out = append(out, p.Descriptor().Name)
	}
	return out
}

func (h *Host) serveProvider(srv *rpc.Server, p Provider) (*rpc.Service, error) {
	d := p.Descriptor()
	svc, err := srv.AddService(rpc.ServiceConfig{
		Name:        protocol.ProviderServicePrefix + d.Name,
		Version:     h.cfg.Version,
		Description: "Brood provider " + d.Name,
		QueueGroup:  protocol.ProviderQueue,
		Metadata:    map[string]string{"hostId": h.id, "provider": d.Name},
	})
	if err != nil {
		return nil, fmt.Errorf("worker: micro service for %s: %w", d.Name, err)
	}
	// This instance's own subjects, <prefix>.v1.provider.<name>.<hostId>.<op>:
	// the coordinator picks the instance (dispatch.go in the coordinator).
	prefix := h.subj.ProviderInstance(d.Name, h.id, "")
	start := rpc.Typed(func(ctx context.Context, _ rpc.Request, r protocol.ProviderStartRequest) (any, error) {
		return h.startRun(ctx, p, r)
	})
	if err := svc.AddEndpoint(protocol.OpProviderStart, prefix+protocol.OpProviderStart, h.instrument(protocol.OpProviderStart, start)); err != nil {
		return nil, err
	}
	cont := rpc.Typed(func(ctx context.Context, _ rpc.Request, r protocol.ProviderContinueRequest) (any, error) {
		return h.continueRun(ctx, p, r)
	})
	if err := svc.AddEndpoint(protocol.OpProviderContinue, prefix+protocol.OpProviderContinue, h.instrument(protocol.OpProviderContinue, cont)); err != nil {
		return nil, err
	}
	if d.Continuable {
		activate := rpc.Typed(func(ctx context.Context, _ rpc.Request, r protocol.ActivateRequest) (any, error) {
			if r.Descriptor == nil {
				return nil, protocol.Errorf(protocol.CodeInvalidArgument, "activate needs the child's descriptor")
			}
			return h.activate(ctx, p, r)
		})
		if err := svc.AddEndpoint(protocol.OpProviderActivate, prefix+protocol.OpProviderActivate, h.instrument(protocol.OpProviderActivate, activate)); err != nil {
			return nil, err
		}
	}
	if pr, ok := p.(Preparer); ok {
		prepare := rpc.Typed(func(ctx context.Context, _ rpc.Request, r protocol.ProviderPrepareRequest) (protocol.ProviderPrepareReply, error) {
			if !protocol.ValidID(r.ParentSession) {
				return protocol.ProviderPrepareReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "parentSession must be a valid id")
			}
			ctx, cancel, err := h.withDeadline(ctx, r.Deadline, "prepare", r.ChildID)
			if err != nil {
				return protocol.ProviderPrepareReply{}, err
			}
			defer cancel()
			return pr.Prepare(ctx, r)
		})
		if err := svc.AddEndpoint(protocol.OpProviderPrepare, prefix+protocol.OpProviderPrepare, h.instrument(protocol.OpProviderPrepare, prepare)); err != nil {
			return nil, err
		}
	}
	return svc, nil
}

// checkDuplicates refuses to start when a live host serves a provider of the
// same name with a different descriptor (DUPLICATE_PROVIDER, docs/design.md §4).
// The listing is retried through transient failures for up to
// FirstHeartbeatBudget: on a cluster just provisioned the hosts bucket may
// have no leader yet ("no responders"), which is no reason to exit.
func (h *Host) checkDuplicates(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, FirstHeartbeatBudget)
	defer cancel()
	recs, err := h.st.HostRecords(ctx)
	if err != nil {
		return err
	}
	now := store.NowMs()
	for _, rec := range recs {
		if now-rec.Heartbeat > h.cfg.HostExpiry.Milliseconds() {
			continue
		}
		for _, theirs := range rec.Providers {
			if !protocol.MayOffer(rec.HostID, theirs.Name) {
				continue // outside its scope: coordinators ignore it too
			}
			for _, p := range h.cfg.Providers {
				ours := p.Descriptor()
				if ours.Name == theirs.Name && !ours.Equal(theirs) {
					return protocol.NewError(protocol.CodeDuplicateProvider, map[string]any{"provider": ours.Name, "hostId": rec.HostID})
				}
			}
		}
	}
	return nil
}

func (h *Host) record() protocol.HostRecord {
	h.mu.Lock()
	draining := h.draining
	h.mu.Unlock()
	var ds []protocol.ProviderDescriptor
	for _, p := range h.cfg.Providers {
		ds = append(ds, p.Descriptor())
	}
	return protocol.HostRecord{
		HostID: h.id, Kind: protocol.HostWorker, Providers: ds, Heartbeat: store.NowMs(),
		StartedAt: h.started, HeartbeatMs: h.cfg.HeartbeatInterval.Milliseconds(), Draining: draining,
	}
}

// FirstHeartbeatBudget bounds the attempts of a host's first heartbeat,
// each bounded by the heartbeat interval plus a second: on a loaded machine
// or during a leader election one attempt may go unanswered, and a host that
// gave up at once would exit (make chaos's seam tests: "worker: first
// heartbeat: context deadline exceeded" under load).
const FirstHeartbeatBudget = 30 * time.Second

// firstBeat writes the first host record, trying again every heartbeat
// interval for up to FirstHeartbeatBudget; the last error when none landed.
func (h *Host) firstBeat(ctx context.Context) error {
	deadline := time.Now().Add(FirstHeartbeatBudget)
	for {
		err := h.beat(ctx)
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		h.log.Warn("first heartbeat not acknowledged; trying again", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(h.cfg.HeartbeatInterval):
		}
	}
}

func (h *Host) beat(ctx context.Context) error {
	bctx, cancel := context.WithTimeout(ctx, h.cfg.HeartbeatInterval+time.Second)
	defer cancel()
	_, err := h.st.PutHost(bctx, h.record())
	return err
}

// heartbeatLoop rewrites the host record every interval. After a gap longer
// than the host expiry (the process was paused, or cut off), coordinators may
// have taken its sessions over: it checks every lease and stops the agents
// whose lease is gone (docs/design.md §7, Settlement 3).
func (h *Host) heartbeatLoop(ctx context.Context) {
	beat := func(ctx context.Context) error {
		err := h.beat(ctx)
		if err == nil {
			h.unsettled.retry(h.log) // JetStream takes writes again
		}
		return err
	}
	store.HeartbeatLoop(ctx, h.cfg.HeartbeatInterval, h.cfg.HostExpiry, beat,
		func(gap time.Duration) {
			h.log.Warn("heartbeat gap exceeded the host expiry; verifying leases", "gap", gap.String())
			h.verifyLeases(ctx)
		},
		func(err error) { h.log.Warn("heartbeat failed", "err", err) })
}

// verifyLeases stops the agents whose lease is provably gone (deleted, or
// naming another holder or run). A lease that cannot be read is kept: a
// failed read is no evidence, and the fenced appends stop an agent whose
// session was taken over anyway. Reads go to the leader, and a lease that
// reads as missing counts only when its run or epoch record is no longer
// running: a lease is deleted only after its record settled (by its holder,
// or by the coordinator that took it over), so a missing lease beside a
// running record is a read that missed it (a leader just elected, or just
// restarted, before it applied every write; seen with leaders killed in
// TestLeaderElectionsAreNotFailures, where it stopped live agents and left
// their records running for good).
func (h *Host) verifyLeases(ctx context.Context) {
	lost := func(provider, id, runID string, still func(protocol.AgentRecord) bool) bool {
		rec, err := h.st.ChildLeaseLatest(ctx, provider, id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			run, rerr := h.st.RunLatestOf(ctx, provider, runID)
			switch {
			case rerr != nil: // not found as well: two reads that missed, or expired records; the fenced appends decide
				h.log.Warn("could not read the run of a lease that reads as missing; keeping the agent", "session", id, "run", runID, "err", rerr)
				return false
			case run.Value.State == protocol.RunRunning:
				h.log.Warn("a lease reads as missing while its run is running; keeping the agent", "session", id, "run", runID)
				return false
			}
			return true
		case err != nil:
			h.log.Warn("could not read a lease after a heartbeat gap; keeping the agent", "session", id, "err", err)
			return false
		}
		return !still(rec.Value)
	}
	for _, a := range h.snapshotActs() {
		if !lost(a.header.Provider, a.childID, a.runID, func(rec protocol.AgentRecord) bool { return rec.HostID == h.id && rec.RunID == a.runID }) {
			continue
		}
		h.log.Warn("lease lost; stopping activation without publishing", "session", a.childID, "run", a.runID)
		a.mu.Lock()
		a.fenced = true
		a.mu.Unlock()
		a.dispose(agent.ErrLeaseLost)
	}
	for _, r := range h.snapshotRuns() {
		if !lost(r.req.Header.Provider, r.childID, r.runID, func(rec protocol.AgentRecord) bool { return rec.HostID == h.id && rec.Epoch == r.epoch }) {
			continue
		}
		h.log.Warn("lease lost; stopping agent without publishing", "session", r.childID, "run", r.runID)
		r.cancel(agent.ErrLeaseLost)
	}
}

// busy reports whether a one-shot run or an activation's turn is in flight.
func (h *Host) busy() bool {
	if len(h.snapshotRuns()) > 0 {
		return true
	}
	for _, a := range h.snapshotActs() {
		a.mu.Lock()
		running := a.running
		a.mu.Unlock()
		if running {
			return true
		}
	}
	return false
}

func (h *Host) snapshotActs() []*activation {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*activation, 0, len(h.acts))
	for _, a := range h.acts {
		out = append(out, a)
	}
	return out
}

func (h *Host) snapshotRuns() []*hostedRun {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*hostedRun, 0, len(h.runs))
	for _, r := range h.runs {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].runID < out[j].runID })
	return out
}

// drain stops admission, lets in-flight turns finish within the grace, then
// disposes the rest, under one deadline for the whole drain: DrainGrace for
// the turns (the provider endpoints' requests in flight included), then
// DrainTeardownMax for every disposal together.
func (h *Host) drain(svcs []*rpc.Service) {
	h.mu.Lock()
	h.draining = true
	h.mu.Unlock()
	h.log.Info("draining: admitting nothing new; in-flight turns get the grace, then are disposed", "grace", h.cfg.DrainGrace.String())
	bctx, cancel := context.WithTimeout(context.Background(), DrainBeatTimeout)
	_ = h.beat(bctx)
	cancel()
	grace, cancel := context.WithTimeout(context.Background(), h.cfg.DrainGrace)
	defer cancel()
	for _, s := range svcs {
		s.Stop(grace) // starts and activations in flight finish (or are refused): nothing new after this
	}
	for grace.Err() == nil && h.busy() {
		select {
		case <-grace.Done():
		case <-time.After(drainPollInterval):
		}
	}
	for _, r := range h.snapshotRuns() {
		r.cancel(&agent.Cancel{Cause: protocol.CauseDisposed})
	}
	// Activations end their epoch; accepted inbox items stay for the next
	// activation, on another host (docs/design.md §7, Settlement 4), and so
	// does a turn parked on a request (KeepParked).
	for _, a := range h.snapshotActs() {
		a.stopKeepingParked(protocol.CauseDisposed)
	}
	teardown := time.NewTimer(DrainTeardownMax)
	defer teardown.Stop()
	for _, a := range h.snapshotActs() {
		select {
		case <-a.done:
		case <-teardown.C:
			h.log.Error("activations did not stop within the drain's teardown bound", "bound", DrainTeardownMax.String(), "left", len(h.snapshotActs()))
			return
		}
	}
	for _, r := range h.snapshotRuns() {
		select {
		case <-r.done:
		case <-teardown.C:
			h.log.Error("runs did not stop within the drain's teardown bound", "bound", DrainTeardownMax.String(), "left", len(h.snapshotRuns()))
			return
		}
	}
}
