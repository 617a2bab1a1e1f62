package coordinator

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
	"go.opentelemetry.io/otel/trace"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Continuable children (docs/design.md §7; the seed's SubagentService). Write order
// of continuable.start: header (expect subject empty: DUPLICATE_CHILD) and
// child index → epoch run record → provider activation (lease, seed,
// descriptor, inbox subscription, subagent/start) → ownership edge (when the
// parent is itself continuable) → admission re-check → the prompt into the
// child's inbox → {childId, messageId}. A failure before the inbox accepted
// the prompt disposes the activation and releases the edge: no ids returned,
// no live child, no ownership left behind.

// LineageDepthMax bounds the walk up a child's ancestry.
const LineageDepthMax = 1024

// DefaultGrantTTL is how long a user grant lives.
const DefaultGrantTTL = 24 * time.Hour

// Bounds of the coordinator's calls to one host (docs/protocol.md, limits).
const (
	// HostCallTimeout bounds a host's answer to state and interrupt.
	HostCallTimeout = 5 * time.Second
	// hostDisposeTimeout bounds a host's answer to dispose: its own wait for
	// the run or activation to end, plus a margin for the reply.
	hostDisposeTimeout = protocol.HostDisposeWaitMax + 2*time.Second
)

// A session whose lease names a dead host is taken over before it is used
// (resident): its lease is read again every residentRetryWait while another
// goroutine of this replica takes it over, or after a takeover of its own
// that left it changing hands, for at most residentWaitMax (and the
// caller's budget). A takeover through a leader election takes seconds (each
// of its writes retried): a fixed number of reads refused a followup that
// its budget would have carried through (TestLeaderElectionsAreNotFailures:
// "session changing hands").
const (
	residentWaitMax   = 10 * time.Second
	residentRetryWait = 100 * time.Millisecond
)

// authorityUser mints a user grant. On the anonymous subject
// <p>.v1.coord.authority.user (which a deployment lets only trusted hosts
// publish) it acts on every session; on a user's own subject
// <p>.v1.user.<user>.authority.user it acts only on the trees of the roots
// that user opened (docs/security.md). The coordinator can refuse every
// grant (Config.UserGrantsDisabled).
func (c *Coordinator) authorityUser(ctx context.Context, req rpc.Request, _ protocol.Empty) (protocol.UserGrantReply, error) {
	if c.cfg.UserGrantsDisabled {
		return protocol.UserGrantReply{}, protocol.Errorf(protocol.CodeUnauthorized, "this deployment mints and accepts no user grants")
	}
	user := c.callerOf(req)
	grant := protocol.NewCredential()
	exp := store.NowMs() + c.cfg.GrantTTL.Milliseconds()
	// The key expires with the grant (CreateGrant's per-key TTL): expired
	// grants take no space.
	if err := c.st.CreateGrant(ctx, protocol.HashCredential(grant),
		protocol.UserGrantRecord{ExpiresAt: exp, MintedBy: c.cfg.ID, User: user}, c.cfg.GrantTTL); err != nil {
		return protocol.UserGrantReply{}, protocol.Errorf(protocol.CodeUnavailable, "store the grant: %w", err)
	}
	return protocol.UserGrantReply{Grant: grant, ExpiresAt: exp, User: user}, nil
}

// lineage returns a session's ancestors, root first, from the headers.
func (c *Coordinator) lineage(ctx context.Context, h protocol.SessionHeader) ([]string, error) {
	var up []string
	for p := h.ParentSession; p != "" && len(up) < LineageDepthMax; {
		up = append(up, p)
		ph, err := c.headers.get(ctx, c.st, p)
		if err != nil {
			return nil, err
		}
		p = ph.ParentSession
	}
	for i, j := 0, len(up)-1; i < j; i, j = i+1, j-1 {
		up[i], up[j] = up[j], up[i]
	}
	return up, nil
}

func (c *Coordinator) continuableStart(ctx context.Context, req rpc.Request, r protocol.ContinuableStartRequest) (protocol.ContinuableStartReply, error) {
	began := time.Now()
	adm, full, err := c.admitContinuable(ctx, r)
	if err != nil {
		return protocol.ContinuableStartReply{}, err
	}
	childID := r.ChildID
	if childID == "" {
		childID = ulid.Make().String()
	} else if !protocol.ValidID(childID) {
		return protocol.ContinuableStartReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "childId must match ^[A-Za-z0-9_-]{1,64}$")
	} else if c.agents.queuedParentOf(childID) != "" {
		// A child id waiting in a start queue (this parent's or another
		// tree's) is in use though it has no header yet: taken again, the
		// queued start would later fail DUPLICATE_CHILD, and the index of
		// queued ids (agentIndex.queuedRuns) would send its user's grant
		// to the other parent's queue.
		return protocol.ContinuableStartReply{}, protocol.NewError(protocol.CodeDuplicateChild, map[string]any{"childId": childID})
	}
	// At the limit, or behind starts that wait already (first in, first
	// out), the start waits in its parent's queue as a runs.start does
	// (startqueue.go).
	if c.queueOn() && (full || c.agents.hasQueue(adm.a.pheader.ID)) {
		return c.queueContinuable(ctx, adm, childID)
	}
	if err := c.reserveChild(ctx, adm.a.pheader.ID, childID, ""); err != nil {
		if c.queueOn() && protocol.CodeOf(err) == protocol.CodeLimitExceeded {
			return c.queueContinuable(ctx, adm, childID)
		}
		return protocol.ContinuableStartReply{}, err
	}
	refund, err := c.admitBudget(ctx, adm.a, childID)
	if err != nil {
		c.releaseChild(ctx, adm.a.pheader.ID, childID)
		return protocol.ContinuableStartReply{}, err
	}
	release := func() { c.releaseChild(ctx, adm.a.pheader.ID, childID); refund() }
	header, err := c.writeContinuableChild(ctx, adm, childID)
	if err != nil {
		if protocol.CodeOf(err) != protocol.CodeDuplicateChild {
			release() // a duplicate is a retried start finding its own child: the slot stays with it
		} else {
			refund() // its first attempt was charged the child
		}
		return protocol.ContinuableStartReply{}, err
	}
	mid, err := c.startFirstEpoch(ctx, adm, header, release, "", "", func(ctx context.Context) error {
		_, err := c.authorizeFresh(ctx, adm.r.Parent)
		return err
	})
	if err != nil {
		return protocol.ContinuableStartReply{}, err
	}
	c.cfg.Metrics.StartAnswered(adm.a.desc.Name, protocol.ModeContinuable, time.Since(began))
	return protocol.ContinuableStartReply{ChildID: childID, MessageID: mid}, nil
}

// continuableAdmission is what admitting a continuable start decided.
type continuableAdmission struct {
	r       protocol.ContinuableStartRequest // its label resolved
	parent  leaseState
	lineage []string              // the parent's ancestry, then the parent
	a       admission             // a.desc: the provider, with the capabilities that apply
	opts    protocol.StartOptions // the options admitted (a queued start's entry keeps them)
}

// admitContinuable checks a continuable start before anything is written:
// the provider hosts continuable children, the parent is the exact live
// agent, the label is given, no drain closes the parent's lineage, and the
// options validate against what the child's provider honours. A parent at
// its live-children limit is refused, or reported full when the
// coordinator queues such starts (startqueue.go).
func (c *Coordinator) admitContinuable(ctx context.Context, r protocol.ContinuableStartRequest) (adm continuableAdmission, full bool, err error) {
	desc, err := c.lookupProvider(r.Provider)
	if err != nil {
		return adm, false, err
	}
	if !desc.Continuable {
		return adm, false, protocol.NewError(protocol.CodeUnsupportedCapability, map[string]any{"provider": r.Provider, "capability": "continuable children"})
	}
	parent, err := c.authorize(ctx, r.Parent)
	if err != nil {
		return adm, false, err
	}
	if r.Label, err = protocol.OneLabel(r.Label, r.Options.Label); err != nil {
		return adm, false, err
	}
	if strings.TrimSpace(r.Label) == "" || len(r.Label) > protocol.LabelBytesMax {
		return adm, false, protocol.Errorf(protocol.CodeInvalidArgument, "label is required (at most %d bytes)", protocol.LabelBytesMax)
	}
	lineage := append(append([]string(nil), parent.rec.Ancestry...), r.Parent.SessionID)
	if err := c.checkDraining(lineage); err != nil {
		return adm, false, err
	}
	opts := protocol.StartOptions{MaxDepth: r.Options.MaxDepth, ToolFilter: r.Options.ToolFilter, Persona: r.Options.Persona, Label: r.Label,
		AutoApprove: r.Options.AutoApprove, ApproveTools: r.Options.ApproveTools, Model: r.Options.Model, Limits: r.Options.Limits, RequestTimeoutMs: r.Options.RequestTimeoutMs,
		Budget: r.Options.Budget}
	desc = continuableDesc(desc)
	var a admission
	if c.queueOn() {
		if err := checkCapabilities(desc, opts); err != nil {
			return adm, false, err
		}
		_, full = c.atLiveLimit(ctx, r.Parent.SessionID)
		a, err = c.admitResolved(ctx, desc, parent, r.Parent.SessionID, r.Prompt, opts)
	} else {
		a, err = c.admitWith(ctx, desc, r.Parent, r.Prompt, opts)
	}
	if err != nil {
		return adm, false, err
	}
	return continuableAdmission{r: r, parent: parent, lineage: lineage, a: a, opts: opts}, full, nil
}

// continuableDesc is desc with the capabilities a continuable child's
// options are checked against. In-process continuable children are
// composed by the manager: the capability flags are not consulted, but
// every option is validated (docs/upstream-behaviour.md §1.4). A remote
// child (ACP) keeps its provider's flags: an option it cannot honour is
// refused, never ignored.
func continuableDesc(desc protocol.ProviderDescriptor) protocol.ProviderDescriptor {
	if !desc.Remote {
		desc.Capabilities = protocol.Capabilities{OutputSchema: false, DepthLimit: true, ToolFilter: true, Persona: true}
	} else {
		desc.Capabilities.OutputSchema = false
	}
	return desc
}

// writeContinuableChild writes a new continuable child's header (with its
// seed, for a provider that inherits the parent's context) and its child
// index entry. An id already used is DUPLICATE_CHILD.
func (c *Coordinator) writeContinuableChild(ctx context.Context, adm continuableAdmission, childID string) (protocol.SessionHeader, error) {
	now := store.NowMs()
	header := c.childHeader(adm.a, childID, now)
	if adm.a.desc.InheritsParentContext {
		seed, err := c.prepare(ctx, adm.a.desc.Name, adm.a.pheader, childID)
		if err != nil {
			return header, err
		}
		header.SeedLength = seed
	}
	// The child's own ledger, when its start named a budget, is written
	// with its header (a retried start's ledger is taken as it is).
	if err := parallel(ctx,
		func() error { return c.st.PutHeader(ctx, header) },
		func() error { return c.createOwnBudget(ctx, adm.a, header, "") },
	); err != nil {
		switch {
		case errors.Is(err, store.ErrConflict):
			return header, protocol.NewError(protocol.CodeDuplicateChild, map[string]any{"childId": childID})
		case protocol.CodeOf(err) != "":
			return header, err
		}
		return header, protocol.Errorf(protocol.CodeUnavailable, "write the header: %w", err)
	}
	c.headers.add(header)
	if err := c.st.PutChildIndex(ctx, header.ParentSession, protocol.ChildIndexRecord{
		ChildID: childID, CreatedAt: now, Mode: protocol.ModeContinuable, Provider: adm.a.desc.Name,
	}); err != nil {
		c.log.Warn("child index not written", "child", childID, "err", err)
	}
	return header, nil
}

// startFirstEpoch starts a new child's first epoch, makes a continuable
// parent its owner, and accepts the prompt, once the parent is still the
// exact live agent (recheck, which reads its lease fresh) and its lineage
// not draining. A failure after the epoch started disposes it, removes the
// edge and releases the slot (release); one before releases the slot. It
// returns the prompt's message id. runID and messageID are the epoch's run
// id and the prompt's message id when drawn already (a queued start), ""
// to draw them now.
func (c *Coordinator) startFirstEpoch(ctx context.Context, adm continuableAdmission, header protocol.SessionHeader, release func(), runID, messageID string, recheck func(context.Context) error) (string, error) {
	childID := header.ID
	owner := ""
	if adm.parent.rec.Kind == protocol.AgentContinuable {
		owner = adm.r.Parent.SessionID
	}
	descriptor := protocol.DescriptorData{
		Version: protocol.DescriptorVersion, Mode: protocol.ModeContinuable, Provider: adm.a.desc.Name, Label: adm.r.Label,
		Persona: adm.a.options.Persona, ToolFilter: adm.a.options.ToolFilter,
	}
	reply, err := c.activateEpoch(ctx, header, descriptor, owner, ancestry(adm.a), true, runID)
	if err != nil {
		release()
		return "", err
	}
	rollback := func() {
		rctx := context.WithoutCancel(ctx)
		// The slot is given back once the epoch ended: released before, it
		// let another start in while this child still lived (chaos seed 4:
		// starts refused DRAINING after their epoch began). A dispose that
		// failed keeps it until the child's lease goes (slots.go).
		if err := c.disposeActivation(rctx, reply.HostID, childID, protocol.CauseDisposed); err == nil {
			release()
		}
		if owner != "" {
			_ = c.st.RemoveOwnership(rctx, owner, childID)
		}
	}
	if owner != "" {
		if err := c.st.AddOwnership(ctx, owner, childID); err != nil {
			rollback()
			return "", protocol.Errorf(protocol.CodeUnavailable, "register ownership: %w", err)
		}
	}
	// Admission: the parent must still be the exact live agent, and its
	// lineage not draining, when the prompt is accepted. The lease is read
	// fresh: a parent whose run just ended (its lease ending or gone) must
	// not be taken as live from a cache that has not seen it yet.
	if err := recheck(ctx); err != nil {
		rollback()
		return "", err
	}
	if err := c.checkDraining(adm.lineage); err != nil {
		rollback()
		return "", err
	}
	mid, _, err := c.st.Enqueue(ctx, header.Scope(), childID, store.InboxItem{
		MessageID: messageID, Content: adm.r.Prompt, Source: protocol.PromptSource(adm.a.pheader), Delivery: store.DeliveryNextTurn,
	}, "")
	if err != nil {
		rollback()
		return "", inboxError(err)
	}
	return mid, nil
}

func inboxError(err error) error {
	if pe := protocol.CodeOf(err); pe != "" {
		return err
	}
	return protocol.Errorf(protocol.CodeUnavailable, "the inbox did not accept the message: %w", err)
}

// activateEpoch creates an epoch's run record and asks a live host of the
// descriptor's provider to materialize the activation (fresh, or a cold
// resume that folds the descriptor from the log). runID is the epoch's run
// id when drawn already (a queued start's first epoch, "" to draw it): a
// record of it there already (an admission of that start before, by a
// replica that died) is taken as it is: activated again while no instance
// claimed it, else answered from it.
func (c *Coordinator) activateEpoch(ctx context.Context, header protocol.SessionHeader, desc protocol.DescriptorData, owner string, ancestry []string, fresh bool, runID string) (protocol.ActivateReply, error) {
	drawn := runID != ""
	if !drawn {
		runID = ulid.Make().String()
	}
	if !fresh {
		// A resumed child is live again from its epoch record on: it takes a
		// slot of its parent first, never refused (an accepted message is
		// never refused), so an admission of a new child counts it from the
		// record rather than from a lease cache that may not hold its lease
		// yet (slots.go; chaos seeds 1 and 4: the limit passed by one).
		if err := c.reserveChild(ctx, header.ParentSession, header.ID, runID); err != nil {
			return protocol.ActivateReply{}, err
		}
	}
	pd, _ := c.reg.Provider(desc.Provider)
	remote := pd.Remote
	rec := protocol.RunRecord{
		RunID: runID, ChildID: header.ID, ParentSession: header.ParentSession, Provider: desc.Provider,
		Mode: protocol.ModeContinuable, State: protocol.RunRunning, CreatedAt: store.NowMs(), Remote: remote,
	}
	if fresh {
		rec.Descriptor = &desc
	}
	rev, err := c.st.CreateRun(ctx, rec)
	if drawn && errors.Is(err, store.ErrConflict) {
		run, rerr := c.st.RunLatest(ctx, runID)
		switch {
		case rerr != nil:
			return protocol.ActivateReply{}, protocol.Errorf(protocol.CodeUnavailable, "read the epoch %s: %w", runID, rerr)
		case run.Value.NotStarted && run.Value.Result != nil:
			return protocol.ActivateReply{}, protocol.Errorf(run.Value.Result.ErrorCode, "%s", run.Value.Result.Diagnostic)
		case run.Value.State == protocol.RunSettled || run.Value.HostID != "":
			return protocol.ActivateReply{HostID: run.Value.HostID, RunID: runID}, nil
		}
		rec, rev, err = run.Value, run.Revision, nil
	} else if err == nil {
		c.cfg.Metrics.RunStarted(rec.Provider, rec.Mode)
	}
	if err != nil {
		return protocol.ActivateReply{}, protocol.Errorf(protocol.CodeUnavailable, "record the epoch: %w", err)
	}
	req := protocol.ActivateRequest{
		ChildID: header.ID, Header: header, RunID: runID, RunRevision: protocol.Seq(rev), Run: rec, Fresh: fresh,
		Descriptor: &desc, Owner: owner, Ancestry: ancestry,
	}
	var reply protocol.ActivateReply
	dctx, cancel := reserve(ctx)
	_, err = c.dispatch(dctx, desc.Provider, protocol.OpProviderActivate, runID, func(deadline int64) any {
		req.Deadline = deadline
		return req
	}, &reply)
	cancel()
	if err != nil && (errors.Is(err, protocol.ErrNotPending) || c.failRun(ctx, rec, rev, err)) {
		// An instance claimed the epoch (one whose answer we did not wait
		// for): it is resident there, or was settled never started.
		if _, err = c.claimedRun(ctx, rec, rev, err); err == nil {
			run, rerr := c.st.RunLatest(ctx, runID)
			if rerr != nil {
				return reply, protocol.Errorf(protocol.CodeUnavailable, "read the epoch %s: %w", runID, rerr)
			}
			return protocol.ActivateReply{HostID: run.Value.HostID, RunID: runID}, nil
		}
	}
	return reply, err
}

// disposeActivation asks a host to end an activation's epoch and waits for it.
func (c *Coordinator) disposeActivation(ctx context.Context, hostID, childID, cause string) error {
	hctx, cancel := context.WithTimeout(ctx, hostDisposeTimeout)
	defer cancel()
	return c.callHost(hctx, hostID, c.subj.Host(hostID, protocol.OpHostDispose),
		protocol.HostRunRequest{ChildID: childID, Cause: cause}, nil)
}

// resident returns a continuable child's lease when an activation of it is
// live; a lease held by a dead host is taken over first (HOST_LOST) so the
// child can resume elsewhere.
func (c *Coordinator) resident(ctx context.Context, childID string) (*store.Record[protocol.AgentRecord], error) {
	deadline := time.Now().Add(residentWaitMax)
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if ctx.Err() != nil || time.Now().After(deadline) {
				break
			}
			t := time.NewTimer(residentRetryWait)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
		l, err := c.st.Lease(ctx, childID)
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, protocol.Errorf(protocol.CodeUnavailable, "read the lease of %s: %w", childID, err)
		}
		if l.Value.TakenOverBy == "" && c.reg.HostLive(l.Value.HostID) {
			return &l, nil
		}
		// The holder is dead (or a takeover is in progress): finish it here.
		if c.claim(childID) {
			c.takeOver(ctx, leaseState{rec: l.Value, rev: l.Revision})
			c.release(childID)
		}
	}
	return nil, protocol.Errorf(protocol.CodeUnavailable, "session %s is changing hands; retry", childID)
}

// residentCached returns a continuable child's lease when this replica's
// lease cache shows its activation live (its host heartbeating, no
// takeover), else nil: a cache that shows nothing is no evidence of
// absence (issue 16's rule), and nothing is decided on it but where a
// followup goes first (continuableFollowup: the accept, which holds for
// either route, then the bucket's answer off the reply path). A followup
// routed to a resident activation that ended just before (its lease's
// deletion not yet in the cache) waits in the inbox for the liveness
// sweep, which reads the bucket (resident) and resumes the child within its
// period; the same holds for an activation that ends right after a read of
// the bucket. It saves a running child's followup one JetStream read
// (issue 12).
func (c *Coordinator) residentCached(ctx context.Context, childID string) *store.Record[protocol.AgentRecord] {
	if l, ok := c.leaseCached(ctx, childID); ok && l.rec.TakenOverBy == "" && c.reg.HostLive(l.rec.HostID) {
		return &store.Record[protocol.AgentRecord]{Value: l.rec, Revision: l.rev}
	}
	return nil
}

// resumable folds a child's descriptor from its own events: NOT_RESUMABLE for
// an unknown id, a one-shot child, or a missing or damaged descriptor. It
// reads the head of the child's own events (the descriptor is logged with
// its first turn's opening), not the whole log: the host that resumes the
// child reads the whole log once (issue 12: one log read per resume), and a
// local provider's child's descriptor is read once per replica
// (descriptorCache). An ACP child's last ACP session is read from the log's
// tail; a log whose head holds no descriptor is read whole.
func (c *Coordinator) resumable(ctx context.Context, h protocol.SessionHeader) (protocol.DescriptorData, error) {
	notResumable := func(reason string) error {
		return protocol.NewError(protocol.CodeNotResumable, map[string]any{"childId": h.ID, "reason": reason})
	}
	local := func(d protocol.DescriptorData) bool {
		desc, ok := c.reg.Provider(d.Provider)
		return ok && !desc.Remote
	}
	if d, ok := c.descs.get(h.ID); ok && local(d) {
		return d, nil
	}
	page, err := c.st.ReadLogPage(ctx, h.Scope(), h.ID, h.SeedLength, 0, descriptorEventsMax, protocol.ReadPageBytesMax)
	if err != nil {
		return protocol.DescriptorData{}, protocol.Errorf(protocol.CodeUnavailable, "read the log of %s: %w", h.ID, err)
	}
	d, err := sessionlog.Descriptor(page.Events, 0)
	if err != nil && !page.Complete {
		log, rerr := c.st.ReadLog(ctx, h.Scope(), h.ID)
		if rerr != nil {
			return protocol.DescriptorData{}, protocol.Errorf(protocol.CodeUnavailable, "read the log of %s: %w", h.ID, rerr)
		}
		d, err = sessionlog.Descriptor(log.Events, h.SeedLength)
	}
	if err != nil {
		return d, notResumable(err.Error())
	}
	// An ACP child lives in its agent's memory: without session/load it
	// cannot come back once its process ended (docs/design.md §6). A provider
	// known to be local has no ACP sessions.
	if local(d) {
		c.descs.add(h.ID, d)
		return d, nil
	}
	tail, _, err := c.st.ReadLogTail(ctx, h.Scope(), h.ID, func(evs []protocol.SessionEvent) bool {
		_, ok := protocol.LastACPSession(evs)
		return ok
	})
	if err != nil {
		return d, protocol.Errorf(protocol.CodeUnavailable, "read the log of %s: %w", h.ID, err)
	}
	if acp, ok := protocol.LastACPSession(tail); ok && !acp.LoadSession {
		return d, notResumable("its ACP agent did not advertise session/load, so ACP session " + acp.SessionID + " cannot be restored after its process ended")
	}
	return d, nil
}

// descriptorEventsMax bounds the events resumable reads from the start of a
// child's own events to find its descriptor (logged in its first record).
const descriptorEventsMax = 64

// resumeOffPath decides, after a followup's reply, whether the child
// needs a resume, and resumes it: in the background, within
// coldResumeBudget and the coordinator's lifetime, continuing the request's
// trace. The followup's caller has its answer once the message is durable
// (and its ownership recorded), not once the activation is up (issue 12;
// docs/design.md §13). The child's lease is read from the bucket (resident: a
// dead host's lease is taken over first) after the message is in the
// inbox, so a live activation read there claims it (the enqueue woke it),
// and an activation that ends after the read finds it pending (as for
// every resident followup). Only with no live lease is the child resumed
// (coldResume: the epoch's run record and lease are created under
// compare-and-set, so two resumes of one child activate it once). A read
// or resume that fails leaves the accepted message to the liveness sweep,
// which resumes every child with pending items (docs/design.md §4, Liveness).
// accepted is the accept's duration, counted under the route the bucket
// gave.
func (c *Coordinator) resumeOffPath(ctx context.Context, h protocol.SessionHeader, d protocol.DescriptorData, owner string, accepted time.Duration) {
	span := trace.SpanFromContext(ctx)
	c.background(func(bg context.Context) {
		rctx, cancel := context.WithTimeout(trace.ContextWithSpan(bg, span), coldResumeBudget)
		defer cancel()
		lease, err := c.resident(rctx, h.ID)
		if err != nil && bg.Err() != nil {
			return // the replica stops: the sweep of another resumes the child
		}
		if err != nil {
			c.log.Warn("a followup's route could not be read; the accepted message waits for the liveness sweep", "session", h.ID, "err", err)
			return
		}
		if lease != nil {
			c.cfg.Metrics.FollowupAccepted(telemetry.RouteResident, accepted)
			return
		}
		c.cfg.Metrics.FollowupAccepted(telemetry.RouteCold, accepted)
		if err := c.coldResume(rctx, h, d, owner); err != nil {
			c.log.Warn("cold resume failed; the accepted message waits for the liveness sweep", "session", h.ID, "err", err)
		}
	})
}

// coldResumeBudget bounds a cold resume started off a followup's reply path.
const coldResumeBudget = 30 * time.Second

// coldResume materializes a new epoch of a child with no live activation in
// any live host of its descriptor's provider (cold resume never calls the
// provider's own logic; it reuses the descriptor's route, persona and tool
// filter). owner is what wakeOwner returned: its edge is registered
// before the epoch can run anything, so an epoch that ends at once
// releases it (registered after the activation, it could come back after
// that release and leave the owner waiting forever). A resume that fails
// keeps the edge: the child still has accepted work, and the epoch that
// eventually runs it releases the edge when it ends.
func (c *Coordinator) coldResume(ctx context.Context, h protocol.SessionHeader, d protocol.DescriptorData, owner string) error {
	if _, ok := c.reg.Provider(d.Provider); !ok {
		return protocol.Errorf(protocol.CodeUnavailable, "no live host of provider %s can resume %s", d.Provider, h.ID)
	}
	up, err := c.lineage(ctx, h)
	if err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "read the lineage of %s: %w", h.ID, err)
	}
	reply, err := c.activateEpoch(ctx, h, d, owner, up, false, "")
	if err != nil {
		if errors.Is(err, protocol.ErrActivationClosing) {
			return nil // another party resumed it meanwhile; it will claim the inbox
		}
		return err
	}
	c.log.Info("cold resume", "session", h.ID, "host", reply.HostID, "run", reply.RunID)
	return nil
}
