// Package coordinator is Brood's coordinator service (docs/design.md §2, §7): the
// provider registry, request validation, authority checks, run admission and
// settlement on HOST_LOST, served as the NATS micro service brood-coordinator
// on `<prefix>.v1.coord.<endpoint>` in one queue group, so replicas share the
// load. It keeps no state that cannot be rebuilt from JetStream: its
// registry, leases and headers are caches of KV watches and stream reads.
package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/oklog/ulid/v2"

	"github.com/brood-dev/brood/internal/buildinfo"
	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Config configures a coordinator. Zero values take the defaults of docs/design.md §4.
type Config struct {
	NC    *nats.Conn
	Store *store.Store
	// ID names this replica; default a new ULID.
	ID string
	// HeartbeatInterval: how often this replica's record is rewritten
	// (protocol.DefaultHeartbeatInterval, 1 s).
	HeartbeatInterval time.Duration
	// HostExpiry: a host whose last heartbeat is older is dead
	// (protocol.DefaultHostExpiry, 5 s).
	HostExpiry time.Duration
	// RootLease: how long a root agent lives without agents.renew
	// (DefaultRootLease, 30 s).
	RootLease time.Duration
	// PromptBytesMax bounds a prompt's text (256 KiB).
	PromptBytesMax int
	// LiveChildrenMax bounds the live children of one parent (64).
	LiveChildrenMax int
	// ProviderAttemptTimeout bounds one attempt of a provider start, prepare
	// or activate at one instance (4 s): an instance that does not answer in
	// time is suspected and the request goes to another live instance
	// (dispatch.go).
	ProviderAttemptTimeout time.Duration
	// RequestBudget is this replica's whole budget for one request whose
	// caller did not send how long it waits (header Brood-Timeout) (20 s):
	// below every client's default timeout (30 s), so a client hears the
	// coordinator's own answer. A request that says how long its caller
	// waits gets that, less replyMargin. Endpoints that wait by design keep
	// their own bounds (ownBound; docs/protocol.md §2.4).
	RequestBudget time.Duration
	// RunAwaitWaitMax caps runs.await's waitMs (60 s).
	RunAwaitWaitMax time.Duration
	// RequestsInFlightMax bounds concurrently handled requests (1024).
	RequestsInFlightMax int
	// StopGrace is how long a stopping replica lets requests in flight
	// finish before it cancels them (5 s); they then answer UNAVAILABLE, so
	// callers retry on another replica.
	StopGrace time.Duration
	// HeadersCachedMax bounds the session header cache (10,000).
	HeadersCachedMax int
	// FollowsMax bounds the follows (events.follow) one replica streams at
	// once (256); more are LIMIT_EXCEEDED.
	FollowsMax int
	// UserFollowsMax bounds the follows of one user on one replica
	// (DefaultUserFollowsMax); more are LIMIT_EXCEEDED (fairshare.go).
	UserFollowsMax int
	// LongPollsMax bounds the long polls (sessions.log and inbox.read
	// with waitMs) one replica holds waiting at once
	// (DefaultLongPollsMax), UserLongPollsMax those of one user
	// (DefaultUserLongPollsMax); more are LIMIT_EXCEEDED. A waiting long
	// poll holds none of the RequestsInFlightMax slots (fairshare.go).
	LongPollsMax, UserLongPollsMax int
	// GrantTTL is how long a user grant lives (24 h); UserGrantsDisabled
	// refuses authority.user altogether.
	GrantTTL           time.Duration
	UserGrantsDisabled bool
	// UserOpenRootsMax bounds the live roots one NATS user holds open at
	// once (DefaultUserOpenRootsMax); agents.open beyond it is
	// LIMIT_EXCEEDED. Only roots opened on a user's own subject count
	// (docs/security.md, quotas.go).
	UserOpenRootsMax int
	// UserRequestsPerSecond and UserRequestsBurst bound the rate of one
	// NATS user's requests to this replica (DefaultUserRequestsPerSecond,
	// DefaultUserRequestsBurst): a token bucket per user; a request over it
	// is LIMIT_EXCEEDED. Anonymous requests (<p>.v1.coord.<endpoint>) are
	// not limited.
	UserRequestsPerSecond float64
	UserRequestsBurst     int
	// UserPromptBytesPerSecond and UserPromptBytesBurst bound the bytes of
	// the prompts (runs.start, continuable.start, followups, reports; the
	// request body, in bytes) one NATS user stores through this replica
	// (DefaultUserPromptBytesPerSecond, DefaultUserPromptBytesBurst): a
	// token bucket per user; a request over it is LIMIT_EXCEEDED (prompt
	// bytes per user) and stores nothing (quotas.go).
	UserPromptBytesPerSecond float64
	UserPromptBytesBurst     int
	// LivenessInterval is how often pending inbox items of sessions with no
	// live activation are looked for and resumed (2 s; docs/design.md §4 asks
	// within 10 s).
	LivenessInterval time.Duration
	Version          string
	Logger           *slog.Logger
	// Metrics, when set, counts what this replica does (runs it admits or
	// settles, takeovers, followups, requests) and reports the hosts and
	// inbox depth it sees.
	Metrics *telemetry.Metrics
}

func (c *Config) defaults() {
	if c.ID == "" {
		c.ID = ulid.Make().String()
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = protocol.DefaultHeartbeatInterval
	}
	if c.HostExpiry <= 0 {
		c.HostExpiry = protocol.DefaultHostExpiry
	}
	if c.RootLease <= 0 {
		c.RootLease = DefaultRootLease
	}
	if c.PromptBytesMax <= 0 {
		c.PromptBytesMax = 256 << 10
	}
	if c.LiveChildrenMax <= 0 {
		c.LiveChildrenMax = 64
	}
	if c.ProviderAttemptTimeout <= 0 {
		c.ProviderAttemptTimeout = DefaultProviderAttemptTimeout
	}
	if c.RequestBudget <= 0 {
		c.RequestBudget = DefaultRequestBudget
	}
	if c.RunAwaitWaitMax <= 0 {
		c.RunAwaitWaitMax = 60 * time.Second
	}
	if c.RequestsInFlightMax <= 0 {
		c.RequestsInFlightMax = 1024
	}
	if c.StopGrace <= 0 {
		c.StopGrace = 5 * time.Second
	}
	if c.HeadersCachedMax <= 0 {
		c.HeadersCachedMax = 10000
	}
	if c.FollowsMax <= 0 {
		c.FollowsMax = 256
	}
	if c.UserFollowsMax <= 0 {
		c.UserFollowsMax = DefaultUserFollowsMax
	}
	if c.LongPollsMax <= 0 {
		c.LongPollsMax = DefaultLongPollsMax
	}
	if c.UserLongPollsMax <= 0 {
		c.UserLongPollsMax = DefaultUserLongPollsMax
	}
	if c.GrantTTL <= 0 {
		c.GrantTTL = DefaultGrantTTL
	}
	if c.LivenessInterval <= 0 {
		c.LivenessInterval = 2 * time.Second
	}
	if c.UserOpenRootsMax <= 0 {
		c.UserOpenRootsMax = DefaultUserOpenRootsMax
	}
	if c.UserRequestsPerSecond <= 0 {
		c.UserRequestsPerSecond = DefaultUserRequestsPerSecond
	}
	if c.UserRequestsBurst <= 0 {
		c.UserRequestsBurst = DefaultUserRequestsBurst
	}
	if c.UserPromptBytesPerSecond <= 0 {
		c.UserPromptBytesPerSecond = DefaultUserPromptBytesPerSecond
	}
	if c.UserPromptBytesBurst <= 0 {
		c.UserPromptBytesBurst = DefaultUserPromptBytesBurst
	}
	if c.Version == "" {
		c.Version = buildinfo.Version
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Coordinator is one replica.
type Coordinator struct {
	cfg  Config
	st   *store.Store
	subj protocol.Subjects
	log  *slog.Logger
	// hostReplies receives the answers of worker hosts (callHost).
	hostReplies *rpc.Replies
	reg         *registry
	agents      *agentIndex
	headers     *headerCache
	descs       *descriptorCache // continuable children's descriptors (local providers)
	follows     *followRegistry
	// longPolls are the long polls waiting now, followSlots the follows
	// streaming (fairshare.go).
	longPolls, followSlots *waitSlots
	started                int64

	hostsWatch, agentsWatch *kvWatch
	runs                    *runIndex // running run and epoch records (orphans.go)
	runsWatch               *kvWatch

	mu         sync.Mutex
	working    map[string]bool                        // sessions with a takeover or disposal in progress (removed when it ends)
	childSlots *slotRecords[childSlotsRecord]         // the parents' live-children slot records (slots.go)
	rootSlots  *slotRecords[protocol.UserRootsRecord] // the users' open-root slot records (openroots.go)
	suspected  suspects                               // provider instances that let an attempt time out
	quotas     userQuotas                             // per-user request rates and root opens (quotas.go)
	ready      chan struct{}
	kick       chan struct{} // runs the liveness sweep now (a drain was lifted)
	offPath    offPath       // work requests started off their reply path
	// slotBackoff is the wait after a contended slot compare-and-set
	// (randomSlotBackoff; tests count its calls).
	slotBackoff func() time.Duration
}

// offPath tracks the work requests start off their reply path (a
// followup's cold resume): it runs in the replica's lifetime, and Run waits
// for it when the replica stops.
type offPath struct {
	mu   sync.Mutex
	ctx  context.Context // nil before Run serves; done once it stops
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// background runs f off the reply path in the replica's lifetime. Once the
// replica is stopping f is not run: what it would have done is left to the
// liveness sweep of a replica that serves (f must be such work).
func (c *Coordinator) background(f func(ctx context.Context)) {
	c.offPath.mu.Lock()
	ctx := c.offPath.ctx
	if ctx == nil || ctx.Err() != nil {
		c.offPath.mu.Unlock()
		return
	}
	c.offPath.wg.Add(1)
	c.offPath.mu.Unlock()
	go func() {
		defer c.offPath.wg.Done()
		f(ctx)
	}()
}

// stopOffPath cancels the work started off the reply path and waits for it.
func (c *Coordinator) stopOffPath() {
	c.offPath.mu.Lock()
	if c.offPath.stop != nil {
		c.offPath.stop()
	}
	c.offPath.mu.Unlock()
	c.offPath.wg.Wait()
}

// Ready is closed once the replica serves its endpoints.
func (c *Coordinator) Ready() <-chan struct{} { return c.ready }

// New validates cfg and returns a coordinator; Run serves it.
func New(cfg Config) (*Coordinator, error) {
	if cfg.NC == nil || cfg.Store == nil {
		return nil, errors.New("coordinator: NC and Store are required")
	}
	cfg.defaults()
	log := cfg.Logger.With("coordinator", cfg.ID)
	reg := newRegistry(cfg.ID, cfg.HeartbeatInterval, cfg.HostExpiry, log)
	agents := newAgentIndex(reg.observed, func(key string, rec protocol.AgentRecord) error {
		ctx, cancel := context.WithTimeout(context.Background(), leaseHeaderWait)
		defer cancel()
		return cfg.Store.LeaseBelongs(ctx, key, rec)
	}, log)
	reg.maxAge = cfg.Store.Cfg.HostsMaxAge
	runs := newRunIndex(reg.observed, cfg.RequestBudget+cfg.HostExpiry)
	runs.ttl = cfg.Store.RunsTTL()
	replies, err := rpc.NewReplies(cfg.NC)
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	c := &Coordinator{
		cfg: cfg, st: cfg.Store, subj: cfg.Store.Subj, log: log,
		hostReplies: replies,
		reg:         reg,
		agents:      agents,
		hostsWatch:  newKVWatch(cfg.Store.Hosts, "hosts", log, reg.put, reg.del),
		agentsWatch: newKVWatch(cfg.Store.Agents, "agents", log, agents.put, agents.del),
		runs:        runs,
		runsWatch:   newKVWatch(cfg.Store.Runs, "runs", log, runs.put, runs.del),
		headers:     &headerCache{boundedMap: newBoundedMap[protocol.SessionHeader](cfg.HeadersCachedMax)},
		descs:       &descriptorCache{newBoundedMap[protocol.DescriptorData](cfg.HeadersCachedMax)},
		follows:     &followRegistry{m: map[string]*follow{}},
		longPolls:   newWaitSlots("long polls", cfg.LongPollsMax, cfg.UserLongPollsMax),
		followSlots: newWaitSlots("follows", cfg.FollowsMax, cfg.UserFollowsMax),
		working:     map[string]bool{},
		ready:       make(chan struct{}),
		kick:        make(chan struct{}, 1),
		slotBackoff: randomSlotBackoff,
	}
	c.childSlots, c.rootSlots = c.newChildSlots(), c.newRootSlots()
	c.headers.verify = c.verifyHeader
	return c, nil
}

// callHost sends req to a worker host's subject (a provider instance's or
// a host's) and decodes its answer into reply, which comes back on a reply
// subject of the host's scope (rpc.Replies: the deployment lets worker-<p>
// publish into no other of the coordinator's inboxes).
func (c *Coordinator) callHost(ctx context.Context, hostID, subject string, req, reply any) error {
	return c.hostReplies.Call(ctx, protocol.HostScope(hostID), subject, req, reply)
}

// ID returns the replica id.
func (c *Coordinator) ID() string { return c.cfg.ID }

// Bounds of the coordinator's own start, stop and gauges.
const (
	// cacheReadyTimeout bounds the first read of brood_hosts and
	// brood_agents into the caches when the coordinator starts.
	cacheReadyTimeout = 30 * time.Second
	// subscribeFlushTimeout bounds the flush that makes the endpoints'
	// subscriptions known to the server before the coordinator is ready.
	subscribeFlushTimeout = 5 * time.Second
	// deregisterTimeout bounds the deletion of the replica's host record
	// when it stops.
	deregisterTimeout = 2 * time.Second
	// inboxDepthTimeout bounds the stream info behind the inbox gauges.
	inboxDepthTimeout = 2 * time.Second
)

type endpoint struct {
	subject string
	handle  rpc.Handler
}

// endpoints is every endpoint the coordinator serves with its request and
// reply shapes (docs/protocol.md §5): each handler gets its request decoded
// (rpc.Typed) and returns its reply. events.follow answers itself and then
// streams (rpc.Replied).
func (c *Coordinator) endpoints() []endpoint {
	return []endpoint{
		{protocol.EpProvidersList, rpc.Typed[protocol.Empty, protocol.ProvidersListReply](c.providersList)},
		{protocol.EpAgentsOpen, rpc.Typed[protocol.AgentsOpenRequest, protocol.AgentsOpenReply](c.agentsOpen)},
		{protocol.EpAgentsRenew, rpc.Typed[protocol.ParentRef, protocol.AgentsRenewReply](c.agentsRenew)},
		{protocol.EpAgentsClose, rpc.Typed[protocol.ParentRef, protocol.Empty](c.agentsClose)},
		{protocol.EpRunsStart, rpc.Typed[protocol.RunStartRequest, protocol.RunStartReply](c.runsStart)},
		{protocol.EpRunsAwait, rpc.Typed[protocol.RunRef, protocol.RunStatus](c.runsAwait)},
		{protocol.EpRunsDispose, rpc.Typed[protocol.RunRef, protocol.RunStatus](c.runsDispose)},
		{protocol.EpContinuableStart, rpc.Typed[protocol.ContinuableStartRequest, protocol.ContinuableStartReply](c.continuableStart)},
		{protocol.EpContinuableFollowup, rpc.Typed[protocol.FollowupRequest, protocol.FollowupReply](c.continuableFollowup)},
		{protocol.EpContinuableState, rpc.Typed[protocol.ChildRef, protocol.StateReply](c.continuableState)},
		{protocol.EpContinuableDrain, rpc.Typed[protocol.DrainRequest, protocol.DrainReply](c.continuableDrain)},
		{protocol.EpContinuableDrains, rpc.Typed[protocol.DrainsListRequest, protocol.DrainsListReply](c.continuableDrains)},
		{protocol.EpContinuableInterrupt, rpc.Typed[protocol.InterruptRequest, protocol.InterruptReply](c.continuableInterrupt)},
		{protocol.EpContinuableReport, rpc.Typed[protocol.ReportRequest, protocol.FollowupReply](c.continuableReport)},
		{protocol.EpChildrenList, rpc.Typed[protocol.ChildrenListRequest, protocol.ChildrenListReply](c.childrenList)},
		{protocol.EpDescendantsDispose, rpc.Typed[protocol.DescendantsDisposeRequest, protocol.DrainReply](c.descendantsDispose)},
		{protocol.EpAuthorityUser, rpc.Typed[protocol.Empty, protocol.UserGrantReply](c.authorityUser)},
		{protocol.EpSessionsGet, rpc.Typed[protocol.SessionGetRequest, protocol.SessionHeader](c.sessionsGet)},
		{protocol.EpSessionsLog, rpc.Typed[protocol.LogReadRequest, protocol.LogPage](c.sessionsLog)},
		{protocol.EpEventsRead, rpc.Typed[protocol.EventsReadRequest, protocol.EventsPage](c.eventsRead)},
		{protocol.EpEventsFollow, rpc.Typed[protocol.EventsFollowRequest, any](c.eventsFollow)},
		{protocol.EpInboxRead, rpc.Typed[protocol.InboxReadRequest, protocol.InboxPage](c.inboxRead)},
		{protocol.EpInboxAck, rpc.Typed[protocol.InboxAckRequest, protocol.InboxAckReply](c.inboxAck)},
		{protocol.EpSessionsResult, rpc.Typed[protocol.SessionResultRequest, protocol.SessionResultReply](c.sessionsResult)},
	}
}

// Run starts the caches, serves the endpoints and watches liveness until ctx
// is done; then it stops admitting, lets the requests in flight finish
// (StopGrace, then they are cancelled) and returns only once every request
// handler and background task returned. A stop through ctx returns nil.
func (c *Coordinator) Run(ctx context.Context) error {
	c.started = store.NowMs()
	defer func() { _ = c.hostReplies.Close() }()
	watchCtx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	var watches sync.WaitGroup
	defer func() { stopWatch(); watches.Wait() }()
	// The runs watch only finds orphaned records (orphans.go): serving does
	// not wait for its first values.
	for _, w := range []*kvWatch{c.hostsWatch, c.agentsWatch, c.runsWatch} {
		watches.Add(1)
		go func() { defer watches.Done(); w.run(watchCtx, nil) }()
	}
	for _, w := range []*kvWatch{c.hostsWatch, c.agentsWatch} {
		select {
		case <-w.ready:
		case <-ctx.Done():
			return nil
		case <-time.After(cacheReadyTimeout):
			return fmt.Errorf("coordinator: the initial values of KV bucket %s were not read within %s", w.name, cacheReadyTimeout)
		}
	}
	if err := c.beat(ctx); err != nil {
		return fmt.Errorf("coordinator: first heartbeat: %w", err)
	}
	c.offPath.mu.Lock()
	c.offPath.ctx, c.offPath.stop = context.WithCancel(context.WithoutCancel(ctx))
	c.offPath.mu.Unlock()
	// Answers go only to inboxes, and on a user's subject only to that
	// user's own (docs/security.md, "Replies go only where replies may
	// go"): the coordinator publishes with rights over every bucket and
	// stream of Brood, so a reply subject of the caller's choosing would
	// make it write records (a confused deputy).
	srv := rpc.NewServer(c.cfg.NC, c.cfg.RequestsInFlightMax, c.log).WithReplyPolicy(rpc.ReplyPolicy{
		UserOf:  func(subject string) string { user, _, _ := c.subj.CallerOf(subject); return user },
		Refused: func(_, reason string) { c.cfg.Metrics.ReplyRefused("coordinator", reason) },
	})
	c.cfg.Metrics.Known("coordinator", []string{rpc.ReplyOutsideInboxes, rpc.ReplyOutsideUserInbox}, nil, nil)
	stopServing := func() {
		sctx, cancel := context.WithTimeout(context.Background(), c.cfg.StopGrace)
		defer cancel()
		srv.Stop(sctx)
		c.stopOffPath()
	}
	svc, err := srv.AddService(rpc.ServiceConfig{
		Name:        protocol.CoordinatorService,
		Version:     c.cfg.Version,
		Description: "Brood coordinator: providers, roots, runs, continuable children",
		QueueGroup:  protocol.CoordinatorQueue,
		Metadata:    map[string]string{"coordinatorId": c.cfg.ID},
	})
	if err != nil {
		return fmt.Errorf("coordinator: micro service: %w", err)
	}
	for _, ep := range c.endpoints() {
		name := strings.ReplaceAll(ep.subject, ".", "_")
		// Every endpoint on its anonymous subject and on each user's
		// (protocol.Subjects.User), where the caller is known.
		subjects := []string{c.subj.Coord(ep.subject), c.subj.User("*", ep.subject)}
		if err := svc.AddEndpointOn(name, subjects, c.budgeted(ep.subject, c.instrument(ep))); err != nil {
			stopServing()
			return fmt.Errorf("coordinator: endpoint %s: %w", ep.subject, err)
		}
	}
	if err := c.serveUnknownEndpoints(srv); err != nil {
		stopServing()
		return err
	}
	// Credit requests of this replica's follows reach this replica only: its
	// own subjects (in the queue group, which the deployment's permissions require).
	for _, subject := range []string{c.subj.FollowCredit(c.cfg.ID), c.subj.UserFollowCredit("*", c.cfg.ID)} {
		if err := srv.Subscribe(subject, protocol.CoordinatorQueue, nil, rpc.Typed(c.followCredit)); err != nil {
			stopServing()
			return fmt.Errorf("coordinator: follow credit subscription: %w", err)
		}
	}
	// Hosts' requests for the notices of the runs they settled (notices.go).
	if err := srv.Subscribe(c.subj.NoticeAll(), protocol.CoordinatorQueue, nil, c.relayNotice); err != nil {
		stopServing()
		return fmt.Errorf("coordinator: notice subscription: %w", err)
	}
	// Hosts' requests for the ends of the epochs they settled (epochend.go).
	if err := srv.Subscribe(c.subj.EpochEndAll(), protocol.CoordinatorQueue, nil, rpc.Typed(c.endEpoch)); err != nil {
		stopServing()
		return fmt.Errorf("coordinator: epoch end subscription: %w", err)
	}
	// Hosts' requests for the deletion of the inbox items their children's
	// logs claimed or discarded (inboxremove.go).
	if err := srv.Subscribe(c.subj.InboxRemoveAll(), protocol.CoordinatorQueue, nil, rpc.Typed(c.removeInboxItems)); err != nil {
		stopServing()
		return fmt.Errorf("coordinator: inbox removal subscription: %w", err)
	}
	// Hosts' reads across providers, answered for their own children only
	// (workerreads.go).
	if err := srv.Subscribe(c.subj.ReadAll(protocol.ReadForkSeed), protocol.CoordinatorQueue, nil, rpc.Typed(c.forkSeed)); err != nil {
		stopServing()
		return fmt.Errorf("coordinator: fork seed subscription: %w", err)
	}
	if err := srv.Subscribe(c.subj.ReadAll(protocol.ReadAncestry), protocol.CoordinatorQueue, nil, rpc.Typed(c.ancestry)); err != nil {
		stopServing()
		return fmt.Errorf("coordinator: ancestry subscription: %w", err)
	}
	// Hosts' reads from the leader of their provider's records (kvlatest.go).
	if err := srv.Subscribe(c.subj.KVLatestAll(), protocol.CoordinatorQueue, nil, rpc.Typed(c.kvLatest)); err != nil {
		stopServing()
		return fmt.Errorf("coordinator: leader read subscription: %w", err)
	}
	// The server knows the endpoints' subscriptions once a flush returns.
	if err := rpc.Subscribed(c.cfg.NC, subscribeFlushTimeout); err != nil {
		stopServing()
		return fmt.Errorf("coordinator: subscribe: %w", err)
	}
	c.log.Info("coordinator serving")
	close(c.ready)
	defer c.cfg.Metrics.CoordinatorGauges(c.reg.liveHosts, c.reg.liveInstances, c.inboxDepth)()

	var bg sync.WaitGroup
	bgCtx, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	bg.Add(3)
	go func() { defer bg.Done(); c.liveness(bgCtx) }()
	go func() {
		defer bg.Done()
		store.HeartbeatLoop(bgCtx, c.cfg.HeartbeatInterval, c.cfg.HostExpiry, c.beat, nil,
			func(err error) { c.log.Warn("heartbeat failed", "err", err) })
	}()
	go func() { defer bg.Done(); c.monitor(bgCtx) }()

	<-ctx.Done()
	// Admit nothing more; the requests in flight finish (within the grace,
	// then cancelled, which ends the follows too) before Run returns.
	stopServing()
	stopBg()
	bg.Wait()
	c.follows.wg.Wait() // each follow ended with an "end" message
	dctx, cancel := context.WithTimeout(context.Background(), deregisterTimeout)
	defer cancel()
	_ = c.st.DeleteHost(dctx, c.cfg.ID)
	c.log.Info("coordinator stopped")
	return nil
}

// serveUnknownEndpoints answers a request to a subject under the coordinator
// group that names no endpoint (a typo) with NOT_FOUND and the list of
// endpoints, so it is told apart from a stopped coordinator (no responders).
// It is a plain queue subscription on `<p>.v1.coord.>` and `<p>.v1.user.>`
// beside the micro service (so `nats micro stats` counts only real
// endpoints) in a queue group of its own; a request to a real endpoint
// reaches it too (one more delivery per request, a map lookup) and is left
// to that endpoint unanswered.
func (c *Coordinator) serveUnknownEndpoints(srv *rpc.Server) error {
	known := map[string]bool{}
	var names []string
	for _, ep := range c.endpoints() {
		known[ep.subject] = true
		names = append(names, ep.subject)
	}
	sort.Strings(names)
	answer := func(_ context.Context, req rpc.Request) (any, error) {
		user, ep, _ := c.subj.CallerOf(req.Subject())
		if id, ok := strings.CutPrefix(ep, followCreditToken); ok {
			return nil, protocol.NewError(protocol.CodeNotFound, map[string]any{
				"what": "the follow's coordinator " + id + " (resume the follow after its last sequence)"})
		}
		return nil, &protocol.Error{Code: protocol.CodeNotFound,
			Message: fmt.Sprintf("endpoint %q not found; the coordinator serves %s for: %s", ep, c.subj.Call(user, "<endpoint>"), strings.Join(names, ", ")),
			Details: map[string]any{"what": "endpoint " + ep, "endpoints": names}}
	}
	accept := func(m *nats.Msg) bool {
		_, ep, ok := c.subj.CallerOf(m.Subject)
		if m.Reply == "" || known[ep] {
			return false
		}
		if !ok {
			return true // <p>.v1.user.<not a user> or <p>.v1.user.<user> alone
		}
		// follow.<coordinatorId> is the credit subject of one replica's
		// follows (FollowCredit): that replica answers while it lives; for
		// one that is gone, NOT_FOUND tells the client to resume the follow.
		if id, ok := strings.CutPrefix(ep, followCreditToken); ok {
			_, live, known := c.reg.hostKnown(id)
			return id != c.cfg.ID && !(known && live)
		}
		return true
	}
	// Its own queue group: NATS groups queue subscribers by queue name across
	// subjects, so sharing the endpoints' group would take requests from them.
	for _, group := range []string{c.subj.CoordGroup(), c.subj.UserGroup()} {
		if err := srv.Subscribe(group+".>", protocol.CoordinatorUnknownQueue, accept, answer); err != nil {
			return fmt.Errorf("coordinator: catch-all subscription: %w", err)
		}
	}
	return nil
}

// callerOf returns the NATS user a request came from: the <user> of a
// request on <p>.v1.user.<user>.<endpoint>, which the deployment lets only
// that user publish (docs/security.md); "" for the anonymous subject
// <p>.v1.coord.<endpoint>, where the coordinator cannot tell who called.
func (c *Coordinator) callerOf(req rpc.Request) string {
	user, _, _ := c.subj.CallerOf(req.Subject())
	return user
}

// instrument counts ep's answers and their latency (brood_requests_total,
// brood_request_duration_seconds).
func (c *Coordinator) instrument(ep endpoint) rpc.Handler {
	handle := c.rateLimited(ep.subject, ep.handle)
	if c.cfg.Metrics == nil {
		return handle
	}
	return func(ctx context.Context, req rpc.Request) (any, error) {
		start := time.Now()
		reply, err := handle(ctx, req)
		c.cfg.Metrics.Request("coordinator", ep.subject, time.Since(start), err)
		return reply, err
	}
}

// inboxDepth reads the pending items of every inbox and how many sessions
// have some (one stream info per scope's inbox stream, bounded by
// inboxDepthTimeout).
func (c *Coordinator) inboxDepth() (items, sessions float64, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), inboxDepthTimeout)
	defer cancel()
	strs, err := c.st.InboxStreams(ctx)
	if err != nil {
		return 0, 0, false
	}
	for _, str := range strs {
		info, err := str.Info(ctx)
		if err != nil {
			return 0, 0, false
		}
		items += float64(info.State.Msgs)
		sessions += float64(info.State.NumSubjects)
	}
	return items, sessions, true
}

// beat writes this replica's heartbeat. The registry waits for it to come
// back through the hosts watch: that is how this replica proves its own view
// current before it judges any host (registry).
func (c *Coordinator) beat(ctx context.Context) error {
	bctx, cancel := context.WithTimeout(ctx, c.cfg.HeartbeatInterval+time.Second)
	defer cancel()
	rev, err := c.st.PutHost(bctx, protocol.HostRecord{
		HostID: c.cfg.ID, Kind: protocol.HostCoordinator, Providers: []protocol.ProviderDescriptor{},
		Heartbeat: store.NowMs(), StartedAt: c.started, HeartbeatMs: c.cfg.HeartbeatInterval.Milliseconds(),
	})
	if err == nil {
		c.reg.wrote(rev)
	}
	return err
}

func (c *Coordinator) providersList(ctx context.Context, req rpc.Request, _ protocol.Empty) (protocol.ProvidersListReply, error) {
	ds, counts := c.reg.providers()
	return protocol.ProvidersListReply{Providers: ds, Instances: counts}, nil
}

// claim marks a session as being worked on (takeover, disposal); false when
// another goroutine of this replica already is.
func (c *Coordinator) claim(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.working[id] {
		return false
	}
	c.working[id] = true
	return true
}

func (c *Coordinator) release(id string) {
	c.mu.Lock()
	delete(c.working, id)
	c.mu.Unlock()
}
