// Package coordinator is Brood's coordinator service (docs/design.md §2, §7): the
// provider registry, request validation, authority checks, run admission and
// settlement on HOST_LOST, served as the NATS micro service brood-coordinator
// on `<prefix>.v1.coord.<endpoint>` in one queue group, so replicas share the
// load. It keeps no state that cannot be rebuilt from JetStream: its
// registry, leases and headers are caches of KV watches and stream reads.
//
// Its rooms are docs/architecture.md §6: a start is admitted in
// admission.go, a dead host's sessions are taken over from liveness.go, and
// the leaf packages under it (hostreg, runindex, slotrecord,
// fairshare) hold the state that separates from the Coordinator type.
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

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/store/kvwatch"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator/fairshare"
	"github.com/brood-dev/brood/services/coordinator/hostreg"
	"github.com/brood-dev/brood/services/coordinator/runindex"
	"github.com/brood-dev/brood/services/coordinator/slotrecord"
)

// Coordinator is one replica.
type Coordinator struct {
	cfg  Config
	st   *store.Store
	subj protocol.Subjects
	log  *slog.Logger
	// hostReplies receives the answers of worker hosts (callHost).
	hostReplies *rpc.Replies
	reg         *hostreg.Registry
	agents      *agentIndex
	headers     *headerCache
	// ledgers are the budget ledgers this replica last read or wrote
	// (budget.go): an update tries its compare-and-set at the revision it
	// knows before it reads the ledger from the leader.
	ledgers ledgerCache
	descs   *descriptorCache // continuable children's descriptors (local providers)
	follows *followRegistry
	// longPolls are the long polls waiting now, followSlots the follows
	// streaming (fairshare.go).
	longPolls, followSlots *fairshare.Slots
	started                int64

	hostsWatch, agentsWatch *kvwatch.Watch
	runs                    *runindex.Index // running run and epoch records (orphans.go)
	runsWatch               *kvwatch.Watch

	mu         sync.Mutex
	working    map[string]bool                               // sessions with a takeover or disposal in progress (removed when it ends)
	childSlots *slotrecord.Records[childSlotsRecord]         // the parents' live-children slot records (slots.go)
	rootSlots  *slotrecord.Records[protocol.UserRootsRecord] // the users' open-root slot records (openroots.go)
	suspected  suspects                                      // provider instances that let an attempt time out
	quotas     userQuotas                                    // per-user request rates and root opens (quotas.go)
	ready      chan struct{}
	kick       chan struct{} // runs the liveness sweep now (a drain was lifted)
	queueKick  chan struct{} // runs the start queues' admissions now (startqueue.go)
	queueLocks keyedLocks    // this replica's changes of each start queue, one at a time
	// queueConfirmed is when each queued parent this replica's cache shows
	// full was last confirmed full from the leader (startqueue.go,
	// queueMayAdmit); only startQueues' goroutine uses it.
	queueConfirmed map[string]time.Time
	offPath        offPath   // work requests started off their reply path
	deadlines      deadlines // budget deadlines armed and being taken up (deadlines.go)
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
	reg := hostreg.New(cfg.ID, cfg.HeartbeatInterval, cfg.HostExpiry, log)
	agents := newAgentIndex(reg.Observed, func(key string, rec protocol.AgentRecord) error {
		ctx, cancel := context.WithTimeout(context.Background(), leaseHeaderWait)
		defer cancel()
		return cfg.Store.LeaseBelongs(ctx, key, rec)
	}, log)
	var c *Coordinator
	agents.queueChanged = func() { c.kickQueues() }
	reg.MaxAge = cfg.Store.Cfg.HostsMaxAge
	runs := runindex.New(reg.Observed, cfg.RequestBudget+cfg.HostExpiry)
	runs.TTL = cfg.Store.RunsTTL()
	replies, err := rpc.NewReplies(cfg.NC)
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	c = &Coordinator{
		cfg: cfg, st: cfg.Store, subj: cfg.Store.Subj, log: log,
		hostReplies: replies,
		reg:         reg,
		agents:      agents,
		hostsWatch:  kvwatch.New(cfg.Store.WatchHosts, "hosts", log, reg.Put, reg.Del),
		agentsWatch: kvwatch.New(cfg.Store.WatchAgents, "agents", log, agents.put, agents.deleted),
		runs:        runs,
		runsWatch:   kvwatch.New(cfg.Store.WatchRuns, "runs", log, runs.Put, runs.Del),
		headers:     &headerCache{boundedMap: newBoundedMap[protocol.SessionHeader](cfg.HeadersCachedMax)},
		descs:       &descriptorCache{newBoundedMap[protocol.DescriptorData](cfg.HeadersCachedMax)},
		follows:     &followRegistry{m: map[string]*follow{}},
		longPolls:   fairshare.New("long polls", cfg.LongPollsMax, cfg.UserLongPollsMax),
		followSlots: fairshare.New("follows", cfg.FollowsMax, cfg.UserFollowsMax),
		working:     map[string]bool{},
		ready:       make(chan struct{}),
		kick:        make(chan struct{}, 1),
		queueKick:   make(chan struct{}, 1),
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
		// Requests for approval (requests.go).
		{protocol.EpRequestsOpen, rpc.Typed[protocol.RequestOpenRequest, protocol.RequestRecord](c.requestsOpen)},
		{protocol.EpRequestsGet, rpc.Typed[protocol.RequestGetRequest, protocol.RequestRecord](c.requestsGet)},
		{protocol.EpRequestsAnswer, rpc.Typed[protocol.RequestAnswerRequest, protocol.RequestRecord](c.requestsAnswer)},
		{protocol.EpRequestsList, rpc.Typed[protocol.RequestsListRequest, protocol.RequestsListReply](c.requestsList)},
		// Budgets (budget.go).
		{protocol.EpBudgetReserve, rpc.Typed[protocol.BudgetReserveRequest, protocol.BudgetReserveReply](c.budgetReserve)},
		{protocol.EpBudgetSettle, rpc.Typed[protocol.BudgetSettleRequest, protocol.Empty](c.budgetSettle)},
		// Pause and raise (budgetraise.go).
		{protocol.EpBudgetGet, rpc.Typed[protocol.BudgetGetRequest, protocol.BudgetGetReply](c.budgetGet)},
		{protocol.EpBudgetRaise, rpc.Typed[protocol.BudgetRaiseRequest, protocol.BudgetRaiseReply](c.budgetRaise)},
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
	for _, w := range []*kvwatch.Watch{c.hostsWatch, c.agentsWatch, c.runsWatch} {
		watches.Add(1)
		go func() { defer watches.Done(); w.Run(watchCtx, nil) }()
	}
	if stopped, err := c.awaitCaches(ctx); stopped || err != nil {
		return err
	}
	if err := c.beat(ctx); err != nil {
		return fmt.Errorf("coordinator: first heartbeat: %w", err)
	}
	c.offPath.mu.Lock()
	c.offPath.ctx, c.offPath.stop = context.WithCancel(context.WithoutCancel(ctx))
	c.offPath.mu.Unlock()
	stopServing, err := c.serve()
	if err != nil {
		return err
	}
	c.log.Info("coordinator serving")
	close(c.ready)
	defer c.cfg.Metrics.CoordinatorGauges(c.reg.LiveHosts, c.reg.LiveInstances, c.inboxDepth)()

	var bg sync.WaitGroup
	bgCtx, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	bg.Add(6)
	go func() { defer bg.Done(); c.liveness(bgCtx) }()
	go func() { defer bg.Done(); c.startQueues(bgCtx) }()
	go func() { defer bg.Done(); c.parkedSweep(bgCtx) }()
	go func() { defer bg.Done(); c.deadlineSweep(bgCtx) }()
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

// awaitCaches waits for the first values of brood_hosts and brood_agents
// (at most cacheReadyTimeout); stopped when ctx was done first.
func (c *Coordinator) awaitCaches(ctx context.Context) (stopped bool, err error) {
	for _, w := range []*kvwatch.Watch{c.hostsWatch, c.agentsWatch} {
		select {
		case <-w.Ready():
		case <-ctx.Done():
			return true, nil
		case <-time.After(cacheReadyTimeout):
			return false, fmt.Errorf("coordinator: the initial values of KV bucket %s were not read within %s", w.Name(), cacheReadyTimeout)
		}
	}
	return false, nil
}

// serve subscribes the endpoints (every endpoint on its anonymous subject
// and on each user's, protocol.Subjects.User, where the caller is known),
// the catch-all for unknown ones and the hosts' subscriptions
// (hostSubscriptions), and returns once the server knows them all. Its
// stop admits nothing more and lets the requests in flight finish (within
// StopGrace, then cancelled), and the work started off their reply path.
func (c *Coordinator) serve() (stop func(), err error) {
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
	stop = func() {
		sctx, cancel := context.WithTimeout(context.Background(), c.cfg.StopGrace)
		defer cancel()
		srv.Stop(sctx)
		c.stopOffPath()
	}
	if err := c.subscribeAll(srv); err != nil {
		stop()
		return nil, err
	}
	// The server knows the endpoints' subscriptions once a flush returns.
	if err := rpc.Subscribed(c.cfg.NC, subscribeFlushTimeout); err != nil {
		stop()
		return nil, fmt.Errorf("coordinator: subscribe: %w", err)
	}
	return stop, nil
}

// subscribeAll adds the micro service with its endpoints, the catch-all
// for unknown endpoints and the hosts' subscriptions to srv.
func (c *Coordinator) subscribeAll(srv *rpc.Server) error {
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
		subjects := []string{c.subj.Coord(ep.subject), c.subj.User("*", ep.subject)}
		if err := svc.AddEndpointOn(name, subjects, c.budgeted(ep.subject, c.instrument(ep))); err != nil {
			return fmt.Errorf("coordinator: endpoint %s: %w", ep.subject, err)
		}
	}
	if err := c.serveUnknownEndpoints(srv); err != nil {
		return err
	}
	for _, s := range c.hostSubscriptions() {
		if err := srv.Subscribe(s.subject, protocol.CoordinatorQueue, nil, s.handle); err != nil {
			return fmt.Errorf("coordinator: %s subscription: %w", s.what, err)
		}
	}
	return nil
}

// hostSubscription is one subject the coordinator serves beside its
// endpoints, in its queue group (which the deployment's permissions
// require).
type hostSubscription struct {
	subject string
	handle  rpc.Handler
	what    string // names it in an error
}

// hostSubscriptions are the subjects served beside the endpoints: the
// credit requests of this replica's follows (its own subjects: they reach
// this replica only) and the hosts' requests.
func (c *Coordinator) hostSubscriptions() []hostSubscription {
	return []hostSubscription{
		{c.subj.FollowCredit(c.cfg.ID), rpc.Typed(c.followCredit), "follow credit"},
		{c.subj.UserFollowCredit("*", c.cfg.ID), rpc.Typed(c.followCredit), "follow credit"},
		// The notices of the runs hosts settled (notices.go).
		{c.subj.NoticeAll(), c.relayNotice, "notice"},
		// The ends of the epochs hosts settled (epochend.go).
		{c.subj.EpochEndAll(), rpc.Typed(c.endEpoch), "epoch end"},
		// The deletion of the inbox items their children's logs claimed or
		// discarded (inboxremove.go).
		{c.subj.InboxRemoveAll(), rpc.Typed(c.removeInboxItems), "inbox removal"},
		// Reads across providers, answered for their own children only
		// (workerreads.go).
		{c.subj.ReadAll(protocol.ReadForkSeed), rpc.Typed(c.forkSeed), "fork seed"},
		{c.subj.ReadAll(protocol.ReadAncestry), rpc.Typed(c.ancestry), "ancestry"},
		// Reads from the leader of their provider's records (kvlatest.go).
		{c.subj.KVLatestAll(), rpc.Typed(c.kvLatest), "leader read"},
	}
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
			_, live, known := c.reg.HostKnown(id)
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
// current before it judges any host (hostreg.Registry).
func (c *Coordinator) beat(ctx context.Context) error {
	bctx, cancel := context.WithTimeout(ctx, c.cfg.HeartbeatInterval+time.Second)
	defer cancel()
	rev, err := c.st.PutHost(bctx, protocol.HostRecord{
		HostID: c.cfg.ID, Kind: protocol.HostCoordinator, Providers: []protocol.ProviderDescriptor{},
		Heartbeat: store.NowMs(), StartedAt: c.started, HeartbeatMs: c.cfg.HeartbeatInterval.Milliseconds(),
	})
	if err == nil {
		c.reg.Wrote(rev)
	}
	return err
}

func (c *Coordinator) providersList(ctx context.Context, req rpc.Request, _ protocol.Empty) (protocol.ProvidersListReply, error) {
	ds, counts := c.reg.Providers()
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
