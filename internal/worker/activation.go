package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/pkg/protocol"
)

// An activation is one residency epoch of a continuable child in this host
// (seed: Activation; docs/design.md §7). The child's inbox in JetStream is its only
// queue: the activation wakes on a core subscription to its wake subject
// (published once an item is stored, or an owned child released it),
// claims items in order and runs one turn each; next-step items (settlement
// notices, reports) join a running turn. Its state is derived, never stored:
// running while a turn runs or work waits, waiting while it owns live
// children, settled otherwise, and then the epoch ends.
//
// Epoch end (the order is the contract): close admission; final flush (every
// append of the epoch was acknowledged, else DURABILITY_FAILED); the epoch's
// result from its own events; the epoch's run record settled by CAS; the
// lease released (residency none); one subagent-settled notice to the live
// parent; the ownership edge released and the parent woken; subagent/end.

// ActivationRecheck bounds how long a waiting activation goes without
// re-checking its owned children, in case a wake was missed.
const ActivationRecheck = 5 * time.Second

// FirstPromptWait bounds how long a fresh activation waits for its first
// prompt (the coordinator enqueues it right after the activation is ready,
// or disposes the activation when the start fails).
const FirstPromptWait = 30 * time.Second

type activation struct {
	h        *Host
	childID  string
	header   protocol.SessionHeader
	provider string
	remote   bool
	runID    string
	run      protocol.RunRecord // the epoch's record as claimed
	runRev   uint64             // the claim's revision: settlement's CAS
	epoch    int64
	owner    string
	start    int       // index of the epoch's first event
	began    time.Time // when the host was asked to activate it

	sess  ContinuableSession
	inbox *store.SessionInbox
	span  trace.Span // the epoch's
	subs  []*nats.Subscription
	dirty atomic.Bool

	ctx     context.Context
	dispose context.CancelCauseFunc
	wake    chan struct{}
	// built is closed once the activation is materialized and its loop runs,
	// or its materialization failed (then done is closed too).
	built chan struct{}
	done  chan struct{}
	// started is closed once subagent/start is stored (or given up on):
	// subagent/end follows it.
	started <-chan struct{}

	mu       sync.Mutex
	leaseRev uint64
	// turnCancel cancels the open turn: set once its claim is logged, nil
	// while no turn is open (claiming, or between turns).
	turnCancel context.CancelCauseFunc
	claiming   bool
	running    bool
	waiting    bool
	parked     bool
	parkedSeen map[protocol.Seq]bool
	abort      *pendingAbort
	closing    bool
	stopCause  string
	awaiting   time.Time // a fresh activation waits for its first prompt until then
	fenced     bool
	durability error
	result     *protocol.SubagentResult
	// orphaned: an ancestor of it is an ended one-shot run (endIfOrphaned
	// found it and dropped what waited).
	orphaned bool
	// continued: the epoch's first host died with a turn open, and this
	// host continues the epoch (continueActivation): its loop continues
	// that turn before it claims anything.
	continued bool
}

// pendingAbort is an interrupt that came while no turn was open: the turn
// that was about to run at that moment ends aborted as soon as it is claimed
// (docs/design.md §7; docs/upstream-behaviour.md §5.11 cancels the running turn, and in
// Brood a turn is about to run from the moment its message is accepted).
type pendingAbort struct {
	cause string
	// claim: a claim was in progress, and whatever it opens is that turn.
	claim bool
	// seqs: otherwise the first of these items (unclaimed at the interrupt)
	// to be claimed is; an item sent later is never aborted by it.
	seqs map[protocol.Seq]bool
}

func (a *activation) poke() {
	a.dirty.Store(true)
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// activate materializes an activation: the lease first (the log's writer),
// then the log (fresh: seed and descriptor; resume: read, fold the
// descriptor, close a turn a dead host left open), then the agent, the inbox
// subscriptions and subagent/start.
func (h *Host) activate(ctx context.Context, p Provider, req protocol.ActivateRequest) (any, error) {
	began := time.Now()
	if h.isDraining() {
		return nil, protocol.Errorf(protocol.CodeDraining, "host %s is draining", h.id)
	}
	if !protocol.ValidID(req.ChildID) || !protocol.ValidID(req.RunID) || req.Header.ID != req.ChildID || req.Run.RunID != req.RunID {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "childId, runId, run.runId and header.id must be valid and agree")
	}
	if err := inScope(p, req.Header); err != nil {
		return nil, err
	}
	// Nothing is written before the epoch is claimed (claim.go); from then on
	// a failure settles the epoch never started.
	cctx, cancelClaim, err := h.withDeadline(ctx, req.Deadline, "activate", req.RunID)
	if err != nil {
		return nil, err
	}
	defer cancelClaim()
	a := &activation{
		h: h, childID: req.ChildID, header: req.Header, provider: req.Descriptor.Provider, remote: p.Descriptor().Remote, runID: req.RunID,
		epoch: 1, owner: req.Owner, began: began,
		inbox: h.inboxOf(req.Header), wake: make(chan struct{}, 1), built: make(chan struct{}), done: make(chan struct{}),
	}
	base, span := telemetry.StartRun(ctx, a.provider, protocol.ModeContinuable, a.runID, req.Header)
	a.ctx, a.dispose = context.WithCancelCause(base)
	a.span = span
	// The activation is known to this host before its lease exists, so a
	// host request (interrupt, state, dispose) that found the lease finds the
	// activation too; it waits for built where it must.
	h.mu.Lock()
	if cur := h.acts[req.ChildID]; cur != nil || h.draining {
		h.mu.Unlock()
		var err error
		if cur == nil {
			err = protocol.Errorf(protocol.CodeDraining, "host %s is draining", h.id)
		} else {
			err = protocol.NewError(protocol.CodeActivationClosing, map[string]any{
				"reason": fmt.Sprintf("session %s is already resident on host %s", req.ChildID, h.id)})
		}
		a.dispose(err)
		telemetry.EndRun(span, nil, err)
		return nil, err
	}
	h.acts[req.ChildID] = a
	h.mu.Unlock()
	fail := func(err error) {
		h.mu.Lock()
		if h.acts[req.ChildID] == a {
			delete(h.acts, req.ChildID)
		}
		h.mu.Unlock()
		a.dispose(err)
		telemetry.EndRun(span, nil, err)
		close(a.built)
		close(a.done)
	}
	a.run, a.runRev, err = h.claim(cctx, req.Run, uint64(req.RunRevision), req.ChildID)
	if errors.Is(err, errClaimUnknown) {
		// The claim may have landed unseen: the coordinator then reports the
		// child active. The activation stays registered (host requests wait
		// for built) until the claim is decided (claimLanded writes it
		// again): one that landed is carried out after all, else the
		// activation is dropped.
		cause, bctx := err, context.WithoutCancel(ctx)
		go func() {
			run, rev, landed := h.claimLanded(a.run, uint64(req.RunRevision), cause)
			if !landed {
				fail(cause)
				return
			}
			a.run, a.runRev = run, rev
			if _, err := h.materialize(bctx, p, req, a); err != nil {
				fail(h.abandon(a.run, a.runRev, err)) // at the hold's revision once materialize held the claim, as below
			}
		}()
		return nil, err
	}
	var reply any
	claimed := err == nil
	if claimed {
		reply, err = h.materialize(context.WithoutCancel(ctx), p, req, a)
	}
	if err != nil {
		if claimed {
			err = h.abandon(a.run, a.runRev, err)
		}
		fail(err)
		return nil, err
	}
	return reply, nil
}

// materialize builds a registered activation and starts its loop (see
// activate): the epoch's lease, its session, the epoch's first log records,
// the inbox and wake subscriptions, subagent/start. A failure releases the
// lease and closes what was built.
func (h *Host) materialize(ctx context.Context, p Provider, req protocol.ActivateRequest, a *activation) (any, error) {
	ctx, cancel := runWrites(ctx) // the epoch's log read, lease, hold and first records
	defer cancel()
	cred := protocol.NewCredential()
	lease, events, lastSubjSeq, err := h.epochLease(ctx, req, cred)
	if err != nil {
		return nil, err
	}
	leaseRev, err := h.st.CreateLease(ctx, lease)
	if err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, protocol.NewError(protocol.CodeActivationClosing, map[string]any{
				"reason": fmt.Sprintf("session %s has a live lease elsewhere", req.ChildID)})
		}
		h.dropUnknownLease(lease) // it may have landed unseen
		return nil, protocol.Errorf(protocol.CodeDurabilityFailed, "take the lease of %s: %w", req.ChildID, err)
	}
	// A release that fails is tried again until it lands (releaseLease).
	release := func() { h.releaseLease(lease.Provider, req.ChildID, leaseRev) }
	// The claim is held again under the lease: a coordinator may have
	// settled the claimed record orphaned while this host had no lease (it
	// was paused between the two); the epoch is then not this host's to
	// start (chaos seed 3, c3-4-48: a worker back from a pause started an
	// epoch settled never started, and its lease kept the child resident
	// with its next message pending).
	runRev, err := h.st.HoldRun(ctx, a.run, a.runRev)
	if err != nil {
		release()
		if errors.Is(err, store.ErrConflict) {
			return nil, protocol.NewError(protocol.CodeNotPending, map[string]any{
				"runId": a.runID, "reason": "the epoch was settled before this host held the session's lease"})
		}
		return nil, protocol.Errorf(protocol.CodeDurabilityFailed, "hold the claim of %s: %w", a.runID, err)
	}
	a.runRev = runRev
	lw := h.st.NewLogWriter(req.Header.Scope(), req.ChildID, lastSubjSeq, int64(len(events)))
	a.mu.Lock()
	a.leaseRev = leaseRev
	if req.Fresh {
		a.awaiting = time.Now().Add(FirstPromptWait)
	}
	a.mu.Unlock()
	a.dirty.Store(true)
	opts := protocol.ResolvedOptions{Persona: req.Descriptor.Persona, ToolFilter: req.Descriptor.ToolFilter, Label: req.Descriptor.Label}
	sess, err := p.NewSession(ctx, SessionSpec{
		Header: req.Header, Options: opts, Credential: cred, Log: lw, Events: events,
		Continuable: true, Inbox: a.inbox, InboxDirty: func() bool { return a.dirty.Swap(false) },
	})
	if err != nil {
		release()
		return nil, err
	}
	cs, ok := sess.(ContinuableSession)
	if !ok {
		release()
		closeSession(sess)
		return nil, protocol.Errorf(protocol.CodeNotResumable, "provider %s cannot host continuable children", p.Descriptor().Name)
	}
	a.sess = cs
	if err := logEpochStart(ctx, req, cs); err != nil {
		release()
		closeSession(cs)
		return nil, err
	}
	a.start = len(cs.Events())
	if err := h.subscribeActivation(a); err != nil {
		release()
		closeSession(cs)
		return nil, err
	}
	if err := context.Cause(a.ctx); err != nil { // disposed (a drain, a lost lease) while it was built
		a.unsubscribe()
		release()
		closeSession(cs)
		if h.isDraining() {
			return nil, protocol.Errorf(protocol.CodeDraining, "host %s is draining", h.id)
		}
		return nil, protocol.NewError(protocol.CodeActivationClosing, map[string]any{
			"reason": fmt.Sprintf("the activation of %s was stopped while it started: %v", req.ChildID, err)})
	}
	a.started = h.st.PublishEvent(protocol.LifecycleEvent{
		Type: protocol.LifecycleStart, RunID: a.runID, Provider: a.provider, ID: a.childID,
		ParentSession: a.header.ParentSession, Local: !a.remote, Mode: protocol.ModeContinuable, Time: store.NowMs(),
		Label: req.Descriptor.Label,
	}, h.eventErr)
	close(a.built)
	go a.loop()
	return protocol.ActivateReply{HostID: h.id, RunID: a.runID}, nil
}

// epochLease returns the lease an epoch takes (with the credential's hash
// and where the epoch's events begin) and, for a cold resume, the child's
// events so far and the log's last subject sequence. A fresh child's epoch
// begins after its seed, session/end-seed and descriptor.
func (h *Host) epochLease(ctx context.Context, req protocol.ActivateRequest, cred string) (protocol.AgentRecord, []protocol.SessionEvent, uint64, error) {
	lease := protocol.AgentRecord{
		SessionID: req.ChildID, Kind: protocol.AgentContinuable, HostID: h.id, Epoch: 1, RunID: req.RunID,
		// Its header's provider (inScope): the lease's key is lease.<provider>.<childId>.
		Provider: req.Header.Provider, CredentialHash: protocol.HashCredential(cred), ParentSession: req.Header.ParentSession,
		Ancestry: req.Ancestry, Owner: req.Owner, CreatedAt: store.NowMs(),
	}
	if req.Fresh {
		start := req.Header.SeedLength // the seed, then session/end-seed, then the descriptor
		if start > 0 {
			start++
		}
		lease.EpochStart = start + 1
		return lease, nil, 0, nil
	}
	log, err := h.st.ReadLog(ctx, req.Header.Scope(), req.ChildID)
	if err != nil {
		return lease, nil, 0, protocol.Errorf(protocol.CodeUnavailable, "read the log of %s: %w", req.ChildID, err)
	}
	lease.EpochStart = int64(len(log.Events))
	return lease, log.Events, log.LastSubjSeq, nil
}

// logEpochStart logs what precedes an epoch's first turn: a fresh child's
// descriptor (after any seed), or, on a resume, the closing of a turn a
// dead host left open, unless that turn is parked on a request and the
// session continues it (ParkedSession: the epoch's loop does, first).
func logEpochStart(ctx context.Context, req protocol.ActivateRequest, cs ContinuableSession) error {
	var first []protocol.SessionEvent
	if req.Fresh {
		first = append(first, mustEvent(protocol.EvSubagentDescriptor, *req.Descriptor))
	} else if ps, ok := cs.(ParkedSession); ok && ps.ParkedTurn() {
		return nil
	} else {
		closing, err := cs.CloseOpenTurn(protocol.TurnEndReason{Kind: protocol.TurnInterrupted, Cause: protocol.CauseHostLost}, store.NowMs())
		if err != nil {
			return protocol.Errorf(protocol.CodeInternal, "close the open turn of %s: %w", req.ChildID, err)
		}
		first = closing
	}
	if len(first) == 0 {
		return nil
	}
	if err := cs.Append(ctx, first...); err != nil {
		return protocol.Errorf(protocol.CodeDurabilityFailed, "log the start of the epoch of %s: %w", req.ChildID, err)
	}
	return nil
}

// subscribeActivation subscribes the activation to its wake subject (of
// its header's scope, its provider: the only wake-ups its worker's NATS
// user may receive) and flushes, so the server knows the subscription
// before anyone is told the activation is ready (else the first prompt's
// wake is lost). It never subscribes to the inbox subject: a wake-up
// carries nothing, and the activation reads its own inbox.
func (h *Host) subscribeActivation(a *activation) error {
	for _, subj := range []string{h.subj.Wake(a.header.Scope(), a.childID)} {
		sub, err := h.cfg.NC.Subscribe(subj, func(*nats.Msg) { a.poke() })
		if err != nil {
			a.unsubscribe()
			return protocol.Errorf(protocol.CodeUnavailable, "subscribe to %s: %w", subj, err)
		}
		a.subs = append(a.subs, sub)
	}
	if err := h.cfg.NC.FlushTimeout(SubscribeFlushTimeout); err != nil {
		a.unsubscribe()
		return protocol.Errorf(protocol.CodeUnavailable, "flush the wake subscription: %w", err)
	}
	return nil
}

func (a *activation) unsubscribe() {
	for _, s := range a.subs {
		_ = s.Unsubscribe()
	}
}

// state is the derived residency state (seed: activationState).
func (a *activation) state() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.closing:
		return protocol.StateSettled
	case a.waiting:
		return protocol.StateWaiting
	default:
		return protocol.StateRunning
	}
}

// loop claims and runs turns until the activation settles or is disposed.
func (a *activation) loop() {
	defer close(a.done)
	log := a.h.log.With("session", a.childID, "run", a.runID)
	// Nothing under an ended one-shot run starts work again (ending.go):
	// checked once the activation is registered, so a dispose that came
	// while it was being created, and found nothing yet, is not lost.
	if a.endIfOrphaned(log) {
		a.closeParked(log)
		a.teardown()
		return
	}
	a.continueParked()
	for a.ctx.Err() == nil && !a.h.isDraining() {
		ran, err := a.runNext()
		if err != nil {
			log.Warn("inbox read failed; retrying", "err", err)
			a.sleep(ReadRetryWait)
			continue
		}
		if a.stopped() {
			break
		}
		if ran {
			a.mu.Lock()
			a.awaiting = time.Time{}
			a.mu.Unlock()
			continue
		}
		if wait := a.firstPromptWait(); wait > 0 {
			a.sleep(min(wait, ActivationRecheck))
			continue
		}
		if a.isParked() {
			// Interrupted with work queued: stay resident, the queue parked,
			// until the next send (docs/upstream-behaviour.md §5.11).
			a.sleep(ActivationRecheck)
			continue
		}
		owned, err := a.ownsLiveChildren()
		if err != nil {
			log.Warn("ownership read failed; retrying", "err", err)
			a.sleep(ReadRetryWait)
			continue
		}
		if owned {
			a.setWaiting(true)
			a.sleep(ActivationRecheck)
			a.setWaiting(false)
			continue
		}
		if a.trySettle() {
			break
		}
	}
	a.teardown()
}

// runNext claims and runs one turn, unless the queue is parked by an
// interrupt and nothing new arrived since. An interrupt never cuts a claim
// short: it cancels the turn once the claim is logged (pendingAbort), so the
// interrupted message is claimed once and its turn ends aborted.
func (a *activation) runNext() (bool, error) {
	if a.isParked() {
		return false, nil
	}
	turnCtx, cancel := context.WithCancelCause(a.ctx)
	defer cancel(nil)
	a.mu.Lock()
	a.claiming, a.running = true, true
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.turnCancel, a.claiming, a.running = nil, false, false
		a.mu.Unlock()
	}()
	out, claimed, err := a.sess.ClaimNext(a.ctx, a.inbox)
	var abort *agent.Cancel
	a.mu.Lock()
	a.claiming = false
	if p := a.abort; p != nil {
		switch {
		case claimed: // the first turn claimed since the interrupt
			if seq, ok := openingClaim(a.sess.Events()); p.claim || (ok && p.seqs[seq]) {
				abort = &agent.Cancel{Cause: p.cause}
			}
			a.abort = nil
		case len(p.seqs) == 0:
			a.abort = nil // the claim in progress found nothing to run
		default:
			p.claim = false
		}
	}
	if claimed {
		a.turnCancel = cancel
	}
	a.mu.Unlock()
	if err != nil {
		return false, err
	}
	if !claimed {
		a.noteOutcome(out)
		return false, nil
	}
	if abort != nil {
		cancel(abort)
	}
	stepsCtx, span := telemetry.StartTurn(turnCtx, out.Turn, out.Trace)
	out = a.sess.RunSteps(stepsCtx)
	telemetry.EndTurn(span, out.Reason, out.Err)
	a.noteOutcome(out)
	return true, nil
}

// continueParked continues, before anything is claimed, the turn the log
// left parked on a request when the session's previous host died
// (ParkedSession.ContinueParked; docs/protocol.md §5.21, "After a
// restart"): as a claimed turn runs (runNext), an interrupt or a dispose
// cancels it.
//
// An epoch continued after its host died (continued) continues its open
// turn here the same way (ContinuingSession.ContinueTurn: docs/protocol.md
// §8.4, "Continued after a host loss").
func (a *activation) continueParked() {
	var cont func(context.Context) agent.Outcome
	if cs, ok := a.sess.(ContinuingSession); ok && a.continued {
		cont = cs.ContinueTurn
	} else if ps, ok := a.sess.(ParkedSession); ok && ps.ParkedTurn() {
		cont = ps.ContinueParked
	} else {
		return
	}
	turnCtx, cancel := context.WithCancelCause(a.ctx)
	defer cancel(nil)
	a.mu.Lock()
	a.running, a.turnCancel = true, cancel
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.turnCancel, a.running = nil, false
		a.mu.Unlock()
	}()
	stepsCtx, span := telemetry.StartTurn(turnCtx, sessionlog.LastTurn(a.sess.Events()), nil)
	out := cont(stepsCtx)
	telemetry.EndTurn(span, out.Reason, out.Err)
	a.noteOutcome(out)
}

// closeParked closes the open turn that the epoch will not continue (an
// ancestor of the child ended: nothing under it starts work again), so the
// log stays balanced and the epoch settles with what happened to it: a
// turn parked on a request as aborted{parent}; the turn an epoch continued
// after its host died (continued) holds open as interrupted{host-lost}, as
// the coordinator closes one it does not continue (takeover.go), and the
// epoch then settles HOST_LOST (teardown; before, the turn was left open
// and the epoch settled completed: I7, chaos seed 3 on d088198). An
// append refused as fenced (a coordinator gave the continuation up and
// wrote the log) leaves the epoch fenced: teardown reads what it wrote.
func (a *activation) closeParked(log *slog.Logger) {
	reason := protocol.TurnEndReason{Kind: protocol.TurnAborted, Cause: protocol.CauseParent}
	if _, ok := a.sess.(ContinuingSession); ok && a.continued {
		reason = protocol.TurnEndReason{Kind: protocol.TurnInterrupted, Cause: protocol.CauseHostLost}
	} else if ps, ok := a.sess.(ParkedSession); !ok || !ps.ParkedTurn() {
		return
	}
	closing, err := a.sess.CloseOpenTurn(reason, store.NowMs())
	if err == nil && len(closing) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), OrphanDiscardTimeout)
		err = a.sess.Append(ctx, closing...)
		cancel()
	}
	if errors.Is(err, store.ErrFenced) {
		a.mu.Lock()
		a.fenced = true
		a.mu.Unlock()
	}
	if err != nil {
		log.Warn("could not close the open turn under an ended ancestor", "reason", reason.Kind, "err", err)
	}
}

// openingClaim returns the inbox sequence the open turn was opened with:
// the last agent/inbox/dequeue right after the claim.
func openingClaim(events []protocol.SessionEvent) (protocol.Seq, bool) {
	for i := len(events) - 1; i >= 0; i-- {
		if events[i].Type != protocol.EvInboxDequeue {
			continue
		}
		var d protocol.InboxDequeueData
		if events[i].Decode(&d) != nil {
			return 0, false
		}
		return d.InboxSeq, true
	}
	return 0, false
}

func (a *activation) noteOutcome(out agent.Outcome) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if out.Fenced {
		a.fenced = true
	}
	if out.Err != nil && a.durability == nil {
		a.durability = out.Err
	}
}

// stopped reports whether the epoch must end now: disposed, fenced, or an
// append JetStream did not acknowledge.
func (a *activation) stopped() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ctx.Err() != nil || a.fenced || a.durability != nil
}

// firstPromptWait is how long a fresh activation may still wait for its
// first prompt before it may settle (0: it may settle now).
func (a *activation) firstPromptWait() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.awaiting.IsZero() {
		return 0
	}
	if d := time.Until(a.awaiting); d > 0 {
		return d
	}
	a.awaiting = time.Time{}
	return 0
}

func (a *activation) setWaiting(w bool) {
	a.mu.Lock()
	a.waiting = w
	a.mu.Unlock()
}

func (a *activation) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-a.wake:
	case <-a.ctx.Done():
	case <-t.C:
	}
}

// isParked reports whether an interrupt parked the queue and no new item
// arrived since; a new item unparks it, and the parked items run first. A
// pending abort unparks the queue for the turn it ends.
func (a *activation) isParked() bool {
	a.mu.Lock()
	parked, seen, aborting := a.parked, a.parkedSeen, a.abort != nil
	a.mu.Unlock()
	if !parked || aborting {
		return false
	}
	items, err := a.sess.Unclaimed(a.ctx, a.inbox)
	if err != nil {
		return true
	}
	parkedWork := false
	for _, it := range items {
		parkedWork = parkedWork || it.Delivery != store.DeliveryQuiet
		if !seen[it.Seq] {
			a.mu.Lock()
			a.parked, a.parkedSeen = false, nil
			a.mu.Unlock()
			return false
		}
	}
	if !parkedWork { // nothing was queued: the interrupt parks nothing
		a.mu.Lock()
		a.parked, a.parkedSeen = false, nil
		a.mu.Unlock()
		return false
	}
	return true
}

// ownsLiveChildren reads the ownership record: a parent that owns live
// continuable children is waiting and cannot settle.
func (a *activation) ownsLiveChildren() (bool, error) {
	rec, err := a.h.st.OwnershipLatestOf(a.ctx, a.header.Scope(), a.childID)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return len(rec.Value.Children) > 0, nil
}

// trySettle closes admission, then looks at the inbox once more: work that
// arrived in the meantime reopens the activation.
func (a *activation) trySettle() bool {
	a.mu.Lock()
	a.closing = true
	a.mu.Unlock()
	items, err := a.sess.Unclaimed(a.ctx, a.inbox)
	if err == nil {
		for _, it := range items {
			if it.Delivery != store.DeliveryQuiet {
				a.mu.Lock()
				a.closing = false
				a.mu.Unlock()
				return false
			}
		}
	}
	return true
}

// InterruptReadTimeout bounds the inbox read of an interrupt.
const InterruptReadTimeout = 5 * time.Second

// interrupt stops the turn running or about to run at this moment, and
// parks the queue until the next send (docs/upstream-behaviour.md §5.11): the open
// turn is cancelled; with no turn open, the turn a claim in progress opens,
// or else the turn of the oldest message waiting, ends aborted as soon as it
// is claimed (pendingAbort). The messages waiting now stay parked; one sent
// after the interrupt unparks them and runs after them. An error means the
// interrupt did not take effect (the inbox could not be read).
func (a *activation) interrupt(ctx context.Context, cause string) error {
	select {
	case <-a.built:
	case <-ctx.Done():
		return protocol.Errorf(protocol.CodeUnavailable, "the activation of %s is still starting", a.childID)
	}
	select {
	case <-a.done:
		return nil // it failed to start or already ended: nothing to stop
	default:
	}
	rctx, cancel := context.WithTimeout(ctx, InterruptReadTimeout)
	defer cancel()
	items, err := a.sess.Unclaimed(rctx, a.inbox)
	if err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "interrupt %s: read its inbox: %w", a.childID, err)
	}
	seen := map[protocol.Seq]bool{}
	waiting := map[protocol.Seq]bool{}
	for _, it := range items {
		seen[it.Seq] = true
		if it.Delivery != store.DeliveryQuiet {
			waiting[it.Seq] = true
		}
	}
	a.mu.Lock()
	a.parked, a.parkedSeen = true, seen
	turn := a.turnCancel
	if turn == nil && a.abort == nil && (a.claiming || len(waiting) > 0) {
		a.abort = &pendingAbort{cause: cause, claim: a.claiming, seqs: waiting}
	}
	a.mu.Unlock()
	if turn != nil {
		turn(&agent.Cancel{Cause: cause})
	}
	a.poke()
	return nil
}

// stop disposes the activation: the current turn is cancelled with cause and
// the epoch ends; accepted items stay in the inbox for the next activation.
func (a *activation) stop(cause string) {
	a.mu.Lock()
	a.closing = true
	if a.stopCause == "" {
		a.stopCause = cause
	}
	a.mu.Unlock()
	a.dispose(&agent.Cancel{Cause: cause})
}

// stopKeepingParked is stop for the host's own drain: a turn parked on a
// request at that moment is left parked, unlogged, for the session's next
// activation (agent.Cancel.KeepParked); the epoch ends.
func (a *activation) stopKeepingParked(cause string) {
	a.mu.Lock()
	a.closing = true
	if a.stopCause == "" {
		a.stopCause = cause
	}
	a.mu.Unlock()
	a.dispose(&agent.Cancel{Cause: cause, KeepParked: true})
}

// OrphanCheckAttemptsMax bounds the reads of an activation's ancestors when
// the store answers with errors.
const OrphanCheckAttemptsMax = 3

// endIfOrphaned discards the pending inbox items, unrun, of a child that has
// an ended one-shot ancestor, and reports whether it has one (the epoch then
// ends without a turn). Read errors are retried, then taken as "not ended".
func (a *activation) endIfOrphaned(log *slog.Logger) bool {
	anc := a.h.endedAncestorRetried(a.header.Provider, a.childID, log)
	if anc == "" {
		return false
	}
	a.mu.Lock()
	a.orphaned = true
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), OrphanDiscardTimeout)
	defer cancel()
	n, err := discardPending(ctx, a.sess, a.inbox, fmt.Sprintf("parent: its ancestor %s ended", anc))
	if err != nil {
		log.Warn("could not discard the pending items of a child whose ancestor ended", "ancestor", anc, "err", err)
	}
	log.Info("an ancestor ended; the child starts no work", "ancestor", anc, "discarded", n)
	return true
}

// endedAncestorRetried is endedAncestor, each read bounded by
// LeaseWriteTimeout, tried up to OrphanCheckAttemptsMax times when the
// store answers with errors; a read that keeps failing is taken as "not
// ended" ("", logged): the coordinators end the child when its ancestor's
// end reaches them.
func (h *Host) endedAncestorRetried(provider, child string, log *slog.Logger) string {
	var anc string
	var err error
	for attempt := 1; attempt <= OrphanCheckAttemptsMax; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), LeaseWriteTimeout)
		anc, err = h.endedAncestor(ctx, provider, child)
		cancel()
		if err == nil {
			return anc
		}
		time.Sleep(min(time.Duration(attempt)*RetryBackoffStep, RetryBackoffMax))
	}
	log.Warn("could not check whether an ancestor ended; going on", "err", err)
	return ""
}

// endedAncestor asks the coordinators for the first ancestor of child, of
// provider (its header's), that is an ended one-shot run, "" when none is
// (protocol.Subjects.Read, ReadAncestry; store.EndedAncestor, computed by a
// coordinator: a worker reads no ancestor's header, child index entry or
// log).
func (h *Host) endedAncestor(ctx context.Context, provider, child string) (string, error) {
	var r protocol.AncestryReply
	err := rpc.Call(ctx, h.cfg.NC, h.subj.Read(provider, protocol.ReadAncestry, child), protocol.Empty{}, &r)
	return r.EndedAncestor, err
}

// teardown ends the epoch (see the order at the top of this file).
func (a *activation) teardown() {
	h := a.h
	log := h.log.With("session", a.childID, "run", a.runID)
	defer func() {
		h.mu.Lock()
		if h.acts[a.childID] == a {
			delete(h.acts, a.childID)
		}
		h.mu.Unlock()
		closeSession(a.sess)
	}()
	a.mu.Lock()
	a.closing = true
	fenced, durability, cause, orphaned := a.fenced, a.durability, a.stopCause, a.orphaned
	a.mu.Unlock()
	a.unsubscribe()
	var final *protocol.SubagentResult // nil: fenced, nothing published
	defer func() { telemetry.EndRun(a.span, final, nil) }()
	events := a.sess.Events()
	if fenced {
		a.mu.Lock()
		leaseRev := a.leaseRev
		a.mu.Unlock()
		logged, own := h.fencedUnderOwnLease(a.header, a.runID, leaseRev, events, log)
		if !own {
			log.Warn("lease lost; activation stopped without publishing")
			return
		}
		events = logged
	}
	// Disposed by an ancestor's end: what waits is dropped, and the parent
	// gets no notice, since the same end disposes the parent and a notice
	// would give it one more step of work before its dispose reached it (a
	// child's turn took its disposed grandchild's notice and completed
	// instead of ending aborted). The same holds for an activation that
	// found its ended ancestor when it started.
	if cause == protocol.CauseParent && !orphaned {
		orphaned = a.endIfOrphaned(log)
	}
	parked, isParked := sessionlog.Parked(events)
	if a.start <= len(events) {
		events = events[a.start:]
	}
	res := sessionlog.EpochOutcome(events)
	if fenced {
		fencedResult(&res, events)
	}
	if cause == protocol.CauseDeadline && !fenced && res.StopReason != protocol.StopError {
		// Ended by its budget's deadline (docs/protocol.md §5.5) while no
		// turn ran, or after one ended otherwise: the result says so.
		res.StopReason = protocol.StopError
		res.ErrorCode = protocol.CodeBudgetExhausted
		res.Diagnostic = "the budget's deadline passed; the session's subtree was ended there"
	}
	if end, ok := sessionlog.LastTurnEnd(events); ok && a.continued && !fenced && durability == nil &&
		end.Reason.Kind == protocol.TurnInterrupted && end.Reason.Cause == protocol.CauseHostLost {
		// Continued after its host died, and found its ended ancestor first
		// (closeParked): the turn its host lost was closed, not continued.
		res.StopReason, res.ErrorCode = protocol.StopAborted, protocol.CodeHostLost
		res.Diagnostic = fmt.Sprintf("host %s stopped heartbeating with turn %d open; an ancestor of the child had ended, so the turn was closed as interrupted, not continued", a.run.HostID, end.Turn)
	}
	if isParked && !fenced {
		// Left parked by the host's drain: the epoch ends, the turn does not.
		res.StopReason = protocol.StopAborted
		res.Diagnostic = fmt.Sprintf("host %s stopped while turn %d waited for the answer to a request; the turn continues from the log when the session resumes", h.id, parked.Turn)
	}
	if durability != nil {
		res.StopReason = protocol.StopError
		res.ErrorCode = protocol.CodeDurabilityFailed
		res.Diagnostic = protocol.TruncateDiagnostic("the epoch's final flush was not acknowledged by JetStream: " + durability.Error())
	}
	final = &res
	rec := store.Settled(a.run, h.id, res)
	rec.Takeovers = int64(takeoversOf(events, 0)) // the epoch's own (events from a.start)
	// Until the settlement lands the lease stays: the epoch is still this
	// host's, and a coordinator ends it (HOST_LOST) if this host goes away.
	h.settle(rec, a.runRev, func() {
		h.cfg.Metrics.RunSettled(a.provider, protocol.ModeContinuable, res, time.Since(a.began))
		ctx, cancel := context.WithTimeout(context.Background(), EpochEndTimeout)
		defer cancel()
		a.mu.Lock()
		a.result = &res
		leaseRev := a.leaseRev
		a.mu.Unlock()
		// The epoch's end is published while the lease is still held: should
		// this host die before it released the lease, a coordinator takes the
		// lease over, finds the record settled and publishes the end again
		// (idempotently), so no notice and no subagent/end is ever lost (chaos
		// seed 2: a worker killed between the settlement and the end).
		<-a.started // subagent/end follows subagent/start on the stream
		var ownershipKept atomic.Bool
		<-h.st.EndEpoch(ctx, store.EpochEnd{
			ChildID: a.childID, Parent: a.header.ParentSession, Owner: a.owner, RunID: a.runID,
			Provider: a.provider, Remote: a.remote, Result: res, AncestorEnded: orphaned, Takeovers: rec.Takeovers,
			Delegate: func(ctx context.Context, owner string) error {
				return h.endEpochRecords(ctx, a.header.Provider, owner, a.childID, a.runID, orphaned)
			},
		}, func(err error) {
			ownershipKept.CompareAndSwap(false, errors.Is(err, store.ErrOwnershipKept))
			h.eventErr(err)
		})
		// An ownership edge left behind would keep the owner waiting for
		// good: its removal is tried again, and the lease goes only after it
		// (the child's next epoch, which adds the edge again, cannot start
		// meanwhile).
		var first func(context.Context) error
		if owner := cmp.Or(a.owner, a.header.ParentSession); ownershipKept.Load() {
			first = func(ctx context.Context) error {
				return h.endEpochRecords(ctx, a.header.Provider, owner, a.childID, a.runID, orphaned)
			}
		}
		// An epoch that ended DURABILITY_FAILED left its turn open: closed
		// once the log takes writes again, while the lease is still held
		// (as a one-shot run's, settleRun).
		if durability != nil {
			h.closeLogAfterDurabilityFailure(a.header.Scope(), a.childID)
		}
		h.releaseLeaseAfter(a.header.Provider, a.childID, leaseRev, first)
		log.Info("activation settled", "stopReason", res.StopReason)
	})
}

func mustEvent(typ string, data any) protocol.SessionEvent {
	ev, err := protocol.NewEvent(typ, store.NowMs(), data)
	if err != nil {
		panic(fmt.Sprintf("encode %s: %v", typ, err)) // only fixed, encodable shapes reach here
	}
	return ev
}

// endEpochRecords asks the coordinators to carry out the part of the end of
// child's epoch runID that writes records only they write
// (store.EndEpochRecords: the settlement notice into the parent's inbox,
// the removal of the ownership edge owner → child, the owner's wake-up) on
// protocol.Subjects.EpochEnd, a request-reply in their queue group: a
// coordinator does it only for a settled epoch of a child of the provider
// the subject names (docs/security.md). provider is the child's header's.
// An error (no coordinator answered, UNAVAILABLE) leaves the edge: the
// caller asks again before it releases the lease (store.ErrOwnershipKept);
// every step is idempotent.
func (h *Host) endEpochRecords(ctx context.Context, provider, owner, child, runID string, ancestorEnded bool) error {
	return rpc.Call(ctx, h.cfg.NC, h.subj.EpochEnd(provider, child),
		protocol.EpochEndRequest{Owner: owner, RunID: runID, AncestorEnded: ancestorEnded}, &protocol.Empty{})
}
