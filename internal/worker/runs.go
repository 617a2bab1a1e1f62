package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/gopool"
	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/pkg/protocol"
)

// hostedRun is one one-shot run hosted by this process.
type hostedRun struct {
	runID, childID string
	remote         bool
	req            protocol.ProviderStartRequest
	run            protocol.RunRecord // as claimed
	runRev         uint64             // the claim's revision: settlement's CAS
	epoch          int64
	seedLen        int64
	sess           Session
	ctx            context.Context
	cancel         context.CancelCauseFunc
	span           trace.Span // the run's; ended once it left the host
	// settled is closed once the run's outcome is decided (settled, lost to
	// another settler, or dropped after a fence); done once its session was
	// also closed and the run left the host.
	settled chan struct{}
	done    chan struct{}
	// started is closed once subagent/start is stored (or given up on):
	// subagent/end follows it.
	started <-chan struct{}

	cred string // the agent's credential (it ends its descendants with it)

	// continued: the run's first host died and this one continues its
	// turn from the log (continue.go); takeovers counts the agent/takeover
	// records of its log (RunRecord.Takeovers).
	continued bool
	takeovers int
	// lw is the log writer of a continued run's session (continue.go):
	// closeLostTurn appends through it when the run is not continued.
	lw *store.LogWriter

	mu       sync.Mutex
	lease    protocol.AgentRecord // as last written by this host
	leaseRev uint64
	result   *protocol.SubagentResult
}

func (h *Host) isDraining() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.draining
}

// startRun publishes a child: it drops a request whose deadline passed,
// claims the run (claim.go) and takes the session's lease at the same time,
// composes the session, logs the first turn's opening, then answers; the
// turn runs on. Nothing is written before the deadline check; a claim that
// fails releases the lease taken beside it, and a failure after the claim
// settles the run as never started. The lease is the fence against a
// coordinator that settles the claimed run as an orphan (its claimer
// silent for the host expiry, settleOrphan in the coordinator): it creates
// the session's lease itself, taken over, before it settles, so of the two
// creates exactly one lands, and a host whose lease create is refused
// starts nothing (this replaced the claim's hold, store.HoldRun, a write in
// series on every start). A claim whose outcome stayed unknown within the
// request's deadline is answered UNAVAILABLE and decided in the background
// by writing it again (claimLanded): when it landed after all, the run is
// this host's (the coordinator reports it started) and starts then, with
// the lease taken beside the claim, or else taken then.
func (h *Host) startRun(ctx context.Context, p Provider, req protocol.ProviderStartRequest) (any, error) {
	if h.isDraining() {
		return nil, protocol.Errorf(protocol.CodeDraining, "host %s is draining", h.id)
	}
	childID := req.Header.ID
	if !protocol.ValidID(childID) || !protocol.ValidID(req.RunID) || req.Run.RunID != req.RunID {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "runId and header.id must be valid ids, run.runId must equal runId (docs/protocol.md §9.3)")
	}
	if err := inScope(p, req.Header); err != nil {
		return nil, err
	}
	if req.Run.ChildID != childID || req.Run.State != protocol.RunRunning || req.RunRevision == 0 {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "run must be the running record of child %s at its revision", childID)
	}
	cctx, cancel, err := h.withDeadline(ctx, req.Deadline, "start", req.RunID)
	if err != nil {
		return nil, err
	}
	lt := h.takeLease(ctx, req, protocol.NewCredential())
	run, runRev, err := h.claim(cctx, req.Run, uint64(req.RunRevision), childID)
	cancel()
	if errors.Is(err, errClaimUnknown) {
		bctx := context.WithoutCancel(ctx)
		go func() {
			claimed, rev, ok := h.claimLanded(run, uint64(req.RunRevision), err)
			if !ok {
				h.dropLease(lt)
				return
			}
			if _, err := h.publishRun(bctx, p, req, claimed, rev, lt); err != nil {
				h.log.Warn("a run whose claim landed late could not start", "run", claimed.RunID, "err", err)
			}
		}()
	}
	if err != nil {
		if !errors.Is(err, errClaimUnknown) {
			go h.dropLease(lt)
		}
		return nil, err
	}
	return h.publishRun(context.WithoutCancel(ctx), p, req, run, runRev, lt)
}

// leaseTake is a one-shot run's lease create, under way beside its claim
// (takeLease).
type leaseTake struct {
	lease protocol.AgentRecord
	cred  string // the agent's credential; lease names its hash
	done  chan struct{}
	rev   uint64 // once done: the lease's revision, or 0 with err
	err   error
}

// takeLease starts the create of the one-shot lease of req's child with
// credential cred, within RunWriteBudget (it waits out a leader election
// of brood_agents as the run's other starting writes do).
func (h *Host) takeLease(ctx context.Context, req protocol.ProviderStartRequest, cred string) *leaseTake {
	lt := &leaseTake{cred: cred, done: make(chan struct{}), lease: protocol.AgentRecord{
		SessionID: req.Header.ID, Kind: protocol.AgentOneShot, HostID: h.id, Epoch: 1, RunID: req.RunID,
		// Its header's provider (inScope): the lease's key is lease.<provider>.<childId>.
		Provider: req.Header.Provider, CredentialHash: protocol.HashCredential(cred), ParentSession: req.Header.ParentSession,
		Ancestry: req.Ancestry, Notify: req.Notify, CreatedAt: store.NowMs(),
	}}
	gopool.Go(ctx, func() { // the start's server's goroutines (ctx carries them)
		defer close(lt.done)
		wctx, cancel := runWrites(ctx)
		defer cancel()
		lt.rev, lt.err = h.st.CreateLease(wctx, lt.lease)
	})
	return lt
}

// dropLease removes the lease lt took for a run that is not this host's to
// start (its claim failed) once its create is decided: at its revision when
// it landed, by dropUnknownLease when its outcome is unknown; a refused
// create (another party's lease) is left alone.
func (h *Host) dropLease(lt *leaseTake) {
	<-lt.done
	switch {
	case lt.err == nil:
		h.releaseLease(lt.lease.Provider, lt.lease.SessionID, lt.rev)
	case !errors.Is(lt.err, store.ErrConflict):
		h.dropUnknownLease(lt.lease)
	}
}

// replaceLease writes lease, this host's for run runID, which it claimed,
// over the session's lease another handler of the same start created
// beside a claim of the same run that failed: another instance's (a start
// dispatched to it first, which it claimed too late), or this host's own (a
// start delivered to it twice: its first claim's answer was lost, the host
// answered UNAVAILABLE, and the dispatch tried it again). The claim decides
// between handlers, so that lease is not the run's, and its handler
// deletes it at its own revision, which this write changed. A lease taken
// over (a coordinator settling the claim orphaned, or taking over a dead
// instance's) or naming another run stays: it returns store.ErrConflict. A
// lease gone meanwhile is created again. (It refused this host's own lease
// too, and a live host settled its own claimed run never started,
// NOT_PENDING: issue 37, item 9.)
func (h *Host) replaceLease(ctx context.Context, lease protocol.AgentRecord, runID string) (uint64, error) {
	wctx, cancel := runWrites(ctx)
	defer cancel()
	for attempt := 0; attempt < leaseReplaceAttemptsMax; attempt++ {
		cur, err := h.st.ChildLeaseLatest(wctx, lease.Provider, lease.SessionID)
		var rev uint64
		switch {
		case errors.Is(err, store.ErrNotFound):
			rev, err = h.st.CreateLease(wctx, lease)
		case err != nil:
			return 0, err
		case cur.Value.TakenOverBy != "" || cur.Value.RunID != runID:
			return 0, store.ErrConflict
		default:
			rev, err = h.st.UpdateLease(wctx, lease, cur.Revision)
		}
		if !errors.Is(err, store.ErrConflict) {
			return rev, err
		}
	}
	return 0, store.ErrConflict
}

// leaseReplaceAttemptsMax bounds replaceLease's reads of a lease that keeps
// changing.
const leaseReplaceAttemptsMax = 3

// publishRun is startRun from the claim on: the run is this host's, and it
// starts or is settled never started. lt is the lease taken beside the
// claim.
func (h *Host) publishRun(ctx context.Context, p Provider, req protocol.ProviderStartRequest, run protocol.RunRecord, runRev uint64, lt *leaseTake) (_ any, err error) {
	var span trace.Span
	defer func() {
		if err != nil && span != nil {
			telemetry.EndRun(span, nil, err)
		}
	}()
	childID := req.Header.ID
	<-lt.done
	lease, cred := lt.lease, lt.cred
	if errors.Is(lt.err, store.ErrConflict) {
		lt.rev, lt.err = h.replaceLease(ctx, lease, run.RunID)
	}
	if lt.err != nil {
		var cause error
		if errors.Is(lt.err, store.ErrConflict) {
			// The lease is taken over (a coordinator settling the claim
			// orphaned holds it, settleOrphan) or names another run: the
			// run is no longer this host's to start.
			cause = protocol.NewError(protocol.CodeNotPending, map[string]any{
				"runId": run.RunID, "reason": "the session's lease is taken over (the claim was settled as orphaned) or names another run"})
		} else {
			h.dropUnknownLease(lease) // it may have landed unseen
			cause = protocol.Errorf(protocol.CodeDurabilityFailed, "take the lease of %s: %w", childID, lt.err)
		}
		return nil, h.abandon(run, runRev, cause)
	}
	seed := req.Header.SeedLength
	// The writes that decide whether the claimed run starts (a seeded
	// child's seed, its first turn) wait out a leader election within
	// runWriteBudget, not the store's WriteBudget.
	wctx, cancelWrites := runWrites(ctx)
	defer cancelWrites()
	lw := h.st.NewLogWriter(req.Header.Scope(), childID, 0, 0)
	sess, err := p.NewSession(wctx, SessionSpec{Header: req.Header, Options: req.Options, Credential: cred, Log: lw})
	if err != nil {
		h.releaseLease(lease.Provider, childID, lt.rev)
		return nil, h.abandon(run, runRev, err)
	}
	base, span := telemetry.StartRun(ctx, req.Provider, protocol.ModeOneShot, req.RunID, req.Header)
	runCtx, cancelRun := context.WithCancelCause(base)
	r := &hostedRun{
		runID: req.RunID, childID: childID, remote: p.Descriptor().Remote, req: req, run: run, runRev: runRev,
		epoch: 1, seedLen: seed, sess: sess, ctx: runCtx, cancel: cancelRun, settled: make(chan struct{}), done: make(chan struct{}), span: span,
		lease: lease, leaseRev: lt.rev, cred: cred,
	}
	h.mu.Lock()
	if h.draining {
		h.mu.Unlock()
		cancelRun(nil)
		closeSession(sess)
		h.releaseLease(lease.Provider, childID, lt.rev)
		return nil, h.abandon(run, runRev, protocol.Errorf(protocol.CodeDraining, "host %s is draining", h.id))
	}
	h.runs[r.runID] = r
	h.mu.Unlock()

	desc, derr := protocol.NewEvent(protocol.EvSubagentDescriptor, store.NowMs(), protocol.DescriptorData{
		Version: protocol.DescriptorVersion, Mode: protocol.ModeOneShot, Provider: req.Provider, Label: req.Options.Label,
		// What composed the child, so a host that continues the run after
		// a host loss composes it the same (continue.go).
		Persona: req.Options.Persona, ToolFilter: req.Options.ToolFilter, OutputSchema: req.Options.OutputSchema,
	})
	var opened bool
	var out agent.Outcome
	if derr == nil {
		// A seeded child's session frames its first turn itself (agent.SeedFraming).
		src := protocol.MessageSource{Kind: protocol.SourceUser}
		if req.Source != nil && req.Source.Kind != "" {
			src = *req.Source // provenance only, as the coordinator judged it
		}
		out, opened = sess.OpenTurn(runCtx, agent.Input{
			Content: req.Prompt, Source: src, Extra: []protocol.SessionEvent{desc},
		})
	}
	if derr != nil || !opened {
		h.unregister(r)
		cancelRun(nil)
		closeSession(sess)
		cause := protocol.Errorf(protocol.CodeDurabilityFailed, "log the first turn of %s: %w", childID, out.Err)
		if derr != nil {
			cause = protocol.Errorf(protocol.CodeInternal, "encode descriptor: %w", derr)
		}
		h.releaseLease(lease.Provider, childID, lt.rev)
		close(r.settled)
		close(r.done)
		return nil, h.abandon(run, runRev, cause)
	}
	// subagent/start is published by the host that published the child, so it
	// always precedes this run's subagent/end on the stream.
	r.started = h.st.PublishEvent(protocol.LifecycleEvent{
		Type: protocol.LifecycleStart, RunID: r.runID, Provider: req.Provider, ID: childID,
		ParentSession: req.Header.ParentSession, Local: !p.Descriptor().Remote, Mode: protocol.ModeOneShot, Time: store.NowMs(),
		Label: req.Options.Label,
	}, h.eventErr)
	if h.turns != nil {
		h.turns.Go(func() { h.execute(r) })
	} else {
		go h.execute(r)
	}
	return protocol.ProviderStartReply{HostID: h.id}, nil
}

func closeSession(s Session) {
	if c, ok := s.(Closer); ok {
		_ = c.Close()
	}
}

func (h *Host) eventErr(err error) { h.log.Warn("lifecycle event not acknowledged", "err", err) }

func (h *Host) closeTurn(ctx context.Context, lw *store.LogWriter, events []protocol.SessionEvent, reason protocol.TurnEndReason) {
	evs, err := sessionlog.CloseOpenTurn(events, reason, store.NowMs())
	if err == nil && len(evs) > 0 {
		_, err = lw.Append(ctx, evs...)
	}
	if err != nil {
		h.log.Warn("could not close the open turn", "err", err)
	}
}

// closeLogRetryWait is the wait between the attempts of
// closeLogAfterDurabilityFailure.
const closeLogRetryWait = 500 * time.Millisecond

// inScope refuses a child whose header names another provider than p: its
// log subject carries the header's provider (protocol.SessionHeader.Scope),
// the only one this provider's workers may write (docs/security.md).
func inScope(p Provider, h protocol.SessionHeader) error {
	if name := p.Descriptor().Name; h.Scope() != name {
		return protocol.Errorf(protocol.CodeInvalidArgument, "the child's header names provider %q, not %q: its log lies in that provider's scope", h.Provider, name)
	}
	return nil
}

// closeLogAfterDurabilityFailure closes the turn a run (or an epoch) that ended
// DURABILITY_FAILED left open in its log, once JetStream takes writes again
// (docs/design.md §4: durable records are reconciled then), so the log replays
// balanced (chaos seed 1 of make test: "turn 1 never ended"), with
// closeOpenTurn, for up to store.SettleBudget.
func (h *Host) closeLogAfterDurabilityFailure(scope, childID string) {
	reason := protocol.TurnEndReason{Kind: protocol.TurnError, Code: protocol.CodeDurabilityFailed, Error: "the session log did not acknowledge an append (DURABILITY_FAILED)"}
	if _, closed, err := h.closeOpenTurn(scope, childID, reason, store.SettleBudget); err != nil {
		h.log.Warn("could not close the turn a durability failure left open", "session", childID, "err", err)
	} else if closed {
		h.log.Info("closed the turn a durability failure left open", "session", childID)
	}
}

// closeOpenTurn closes the turn left open in the log of childID with
// reason. The host still holds the session's lease, so no one else may
// append: it reads the log from the leader and appends the closing
// (sessionlog.CloseOpenTurn) fenced on its last record, trying for up to
// budget; a refused append reads again (the append that failed may have
// landed after all). It returns the log's events afterwards and whether it
// appended a closing; an error when the log was not read, or its open turn
// not closed, within budget.
func (h *Host) closeOpenTurn(scope, childID string, reason protocol.TurnEndReason, budget time.Duration) ([]protocol.SessionEvent, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	for {
		log, err := h.st.ReadLog(ctx, scope, childID)
		if err == nil {
			var closing []protocol.SessionEvent
			if closing, err = sessionlog.CloseOpenTurn(log.Events, reason, store.NowMs()); err != nil {
				return log.Events, false, err
			}
			if len(closing) == 0 {
				return log.Events, false, nil
			}
			var written []protocol.SessionEvent
			if written, err = h.st.NewLogWriter(scope, childID, log.LastSubjSeq, int64(len(log.Events))).Append(ctx, closing...); err == nil {
				return append(log.Events, written...), true, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, false, err
		case <-time.After(closeLogRetryWait):
		}
	}
}

// fencedUnderOwnLease decides what a fence means for a run or an epoch of
// the child header names (runID, its lease written at leaseRev; events,
// its agent's events): an append of its agent was refused (another party
// wrote the log), or the lease read as gone after a heartbeat gap
// (verifyLeases). The lease is read again from the bucket's leader, for up
// to store.SettleBudget. Gone, or at another revision (naming another
// holder or run), the session is no longer this host's: it reports false,
// and the agent stops without settling or publishing (the lease's new
// holder ends the run). A lease that cannot be read counts as lost too.
//
// Still this host's, at the revision it wrote, the write came from a party
// that held no lease (a takeover that lost its lease while it stalled;
// RELIABILITY.md, open finding 1): no one else would ever end the run, and
// its lease would keep the child resident, its inbox pending, for good. It
// then ends here: a turn the log still has open is closed as interrupted
// (fenced on the log's last record; closeOpenTurn), and it returns the
// log's events, from which the caller settles, publishes the end and
// releases the lease as for any end (for a continuable child, the liveness
// pass then resumes the messages still pending on a next epoch). A log that
// cannot be read or closed leaves the agent's own events to stand in (a
// next epoch closes a turn left open when it resumes the log).
func (h *Host) fencedUnderOwnLease(header protocol.SessionHeader, runID string, leaseRev uint64, events []protocol.SessionEvent, log *slog.Logger) ([]protocol.SessionEvent, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), store.SettleBudget)
	defer cancel()
	l, err := h.st.ChildLeaseLatest(ctx, header.Provider, header.ID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, false
	case err != nil:
		log.Warn("could not read the lease of a fenced agent; taking it as lost", "err", err)
		return nil, false
	case l.Revision != leaseRev || l.Value.HostID != h.id || l.Value.RunID != runID:
		return nil, false
	}
	log.Warn("session log fenced while this host still holds the lease; ending it with its turn interrupted")
	logged, _, err := h.closeOpenTurn(header.Scope(), header.ID,
		protocol.TurnEndReason{Kind: protocol.TurnInterrupted, Cause: protocol.CauseHostLost}, store.SettleBudget)
	if err != nil || len(logged) < len(events) {
		log.Warn("could not read or close the log of a fenced agent; ending it from the agent's events", "err", err)
		return events, true
	}
	return logged, true
}

// fencedResult marks the result of a run or an epoch that ended on a fence
// under its own lease (fencedUnderOwnLease), from events (its own, from its
// start): a turn the log closed as interrupted ends it as a takeover's
// closing would (one-shot error, an epoch aborted; HOST_LOST), with a
// diagnostic that says what happened.
func fencedResult(res *protocol.SubagentResult, events []protocol.SessionEvent) {
	res.Diagnostic = "another party wrote the session log while this host held the session's lease; the run ended there"
	if end, ok := sessionlog.LastTurnEnd(events); ok && end.Reason.Kind == protocol.TurnInterrupted {
		res.ErrorCode = protocol.CodeHostLost
		res.Diagnostic = "another party closed the turn in flight as interrupted while this host held the session's lease; the run ended there"
	}
}

func (h *Host) unregister(r *hostedRun) {
	h.mu.Lock()
	if h.runs[r.runID] == r {
		delete(h.runs, r.runID)
	}
	h.mu.Unlock()
}

// execute runs the turn to its end and settles the run, unless the host lost
// the session (then it publishes nothing).
func (h *Host) execute(r *hostedRun) {
	defer close(r.done)
	var final *protocol.SubagentResult // nil: fenced, nothing published
	defer func() { telemetry.EndRun(r.span, final, nil) }()
	defer h.unregister(r)
	defer closeSession(r.sess)
	defer waitSettled(r.sess) // a run that ended unpublished or unsettled
	defer close(r.settled)
	if o, ok := r.sess.(settleOverlapper); ok {
		o.OverlapSettles()
	}
	var out agent.Outcome
	var events []protocol.SessionEvent
	// A continued run under an ended ancestor is not continued: nothing
	// under an ended one-shot run starts work again (docs/design.md §14),
	// and its ancestor's dispose reached no one, its host being dead.
	orphanedBy := ""
	if r.continued && r.lw != nil {
		orphanedBy = h.endedAncestorRetried(r.req.Header.Provider, r.childID, h.log.With("session", r.childID, "run", r.runID))
	}
	switch cs, ok := r.sess.(ContinuingSession); {
	case orphanedBy != "":
		events, out = h.closeLostTurn(r, orphanedBy)
	case ok && r.continued:
		out = cs.ContinueTurn(r.ctx)
		events = r.sess.Events()
	default:
		out = r.sess.RunSteps(r.ctx)
		events = r.sess.Events()
	}
	if out.Fenced {
		r.mu.Lock()
		leaseRev := r.leaseRev
		r.mu.Unlock()
		log := h.log.With("session", r.childID, "run", r.runID)
		logged, own := h.fencedUnderOwnLease(r.req.Header, r.runID, leaseRev, events, log)
		if !own {
			log.Warn("lease lost; agent stopped without publishing")
			return
		}
		events = logged
	}
	// The run's end disposes its descendants before it settles (ending.go).
	if d, ok := r.sess.(Delegator); ok && d.Delegated() && !h.endDescendants(r) {
		return
	}
	var c *agent.Cancel
	// A cut at the budget's deadline is no owner's cancel: the turn ended
	// error BUDGET_EXHAUSTED and the result says so (docs/protocol.md §5.5).
	ownerCancelled := errors.As(context.Cause(r.ctx), &c) && c.Cause != protocol.CauseDeadline
	if int64(len(events)) >= r.seedLen {
		events = events[r.seedLen:]
	}
	res := sessionlog.OneShotOutcome(events, ownerCancelled, r.req.Options.OutputSchema != "")
	if out.Fenced {
		fencedResult(&res, events)
	}
	if end, ok := sessionlog.LastTurnEnd(events); ok && orphanedBy != "" && !out.Fenced && out.Err == nil &&
		end.Reason.Kind == protocol.TurnInterrupted && end.Reason.Cause == protocol.CauseHostLost {
		// As the coordinator's takeover ends a run it does not continue
		// (takenOverResult): error, HOST_LOST.
		res.StopReason, res.ErrorCode = protocol.StopError, protocol.CodeHostLost
		res.Diagnostic = fmt.Sprintf("host %s stopped heartbeating with turn %d open; an ancestor of the child (%s) had ended, so the turn was closed as interrupted, not continued", r.run.HostID, end.Turn, orphanedBy)
	}
	if out.Err != nil {
		res.StopReason = protocol.StopError
		res.ErrorCode = protocol.CodeDurabilityFailed
		res.Diagnostic = protocol.TruncateDiagnostic("JetStream did not acknowledge the session log: " + out.Err.Error())
	}
	final = &res
	h.settleRun(r, res, out.Err != nil)
}

// closeLostTurn ends a continued run (continue.go) whose ancestor anc
// ended instead of continuing it: the turn its host lost, open in the log,
// is closed interrupted{host-lost}, as the coordinator closes a turn it
// does not continue (services/coordinator/takeover.go), with one append
// through the run's log writer, bounded by OrphanDiscardTimeout. It
// returns the session's events with the closing, and the Outcome: Fenced
// when the append was refused as fenced (a coordinator gave the
// continuation up and wrote the log; execute reads what it wrote), Err
// when the closing was not logged.
func (h *Host) closeLostTurn(r *hostedRun, anc string) ([]protocol.SessionEvent, agent.Outcome) {
	events := r.sess.Events()
	h.log.Info("an ancestor ended; the continued run's turn is closed, not continued", "session", r.childID, "run", r.runID, "ancestor", anc)
	closing, err := sessionlog.CloseOpenTurn(events, protocol.TurnEndReason{Kind: protocol.TurnInterrupted, Cause: protocol.CauseHostLost}, store.NowMs())
	if err == nil && len(closing) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), OrphanDiscardTimeout)
		var written []protocol.SessionEvent
		written, err = r.lw.Append(ctx, closing...)
		cancel()
		if err == nil {
			events = append(slices.Clip(events), written...)
		}
	}
	switch {
	case errors.Is(err, store.ErrFenced):
		return events, agent.Outcome{Fenced: true}
	case err != nil:
		h.log.Warn("could not close the open turn of a continued run under an ended ancestor", "session", r.childID, "err", err)
		return events, agent.Outcome{Err: err}
	}
	return events, agent.Outcome{}
}

// settleRun records the result by CAS on the run record at the claim's
// revision, retrying transient failures (docs/design.md §7, Settlement 1; settle
// in claim.go); only the winner publishes notify and subagent/end, then
// releases the lease. Until the settlement lands the lease stays: the run is
// still this host's, and a coordinator settles it from the log if this host
// goes away.
func (h *Host) settleRun(r *hostedRun, res protocol.SubagentResult, durability bool) {
	rec := store.Settled(r.run, h.id, res)
	rec.Takeovers = int64(r.takeovers)
	h.settle(rec, r.runRev, func() {
		r.mu.Lock()
		r.result = &res
		leaseRev := r.leaseRev
		r.mu.Unlock()
		h.cfg.Metrics.RunSettled(rec.Provider, rec.Mode, res, time.Duration(rec.SettledAt-rec.CreatedAt)*time.Millisecond)
		<-r.started
		<-h.st.PublishRunEnd(rec, h.st.RequestRunNotice, h.eventErr) // the end is stored before the lease goes
		if durability {
			h.closeLogAfterDurabilityFailure(rec.Provider, r.childID)
		}
		// The run's last budget settlements overlap its settlement and
		// result; they end while the lease is held (settleOverlapper).
		waitSettled(r.sess)
		h.releaseLease(r.req.Header.Provider, r.childID, leaseRev)
	})
}

// hostHandler serves `<prefix>.v1.host.<hostId>.<op>` from the host's
// endpoint table, which names each operation's request and reply shapes
// (rpc.Typed decodes the request). An unknown operation is
// INVALID_ARGUMENT.
func (h *Host) hostHandler() rpc.Handler {
	ops := map[string]rpc.Handler{
		protocol.OpHostDispose:   rpc.Typed(h.hostDispose),
		protocol.OpHostCancel:    rpc.Typed(h.hostDispose),
		protocol.OpHostInterrupt: rpc.Typed(h.hostInterrupt),
		protocol.OpHostState:     rpc.Typed(h.hostState),
	}
	return func(ctx context.Context, req rpc.Request) (any, error) {
		op := req.Subject()[strings.LastIndexByte(req.Subject(), '.')+1:]
		handle, ok := ops[op]
		if !ok {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "unknown host operation %q", op)
		}
		return handle(ctx, req)
	}
}

// hostDispose serves dispose and cancel: a run by its id, or else the
// resident activation of the child.
func (h *Host) hostDispose(ctx context.Context, _ rpc.Request, r protocol.HostRunRequest) (any, error) {
	if r.RunID == "" {
		return h.disposeActivation(ctx, r.ChildID, r.Cause)
	}
	return h.dispose(ctx, r)
}

// hostInterrupt interrupts the resident activation's turn, if any.
func (h *Host) hostInterrupt(ctx context.Context, _ rpc.Request, r protocol.HostChildRequest) (protocol.Empty, error) {
	if a := h.activationOf(r.ChildID); a != nil {
		if err := a.interrupt(ctx, r.Cause); err != nil {
			return protocol.Empty{}, err
		}
	}
	return protocol.Empty{}, nil
}

// hostState answers the state of the child's resident activation here.
func (h *Host) hostState(_ context.Context, _ rpc.Request, r protocol.HostChildRequest) (protocol.StateReply, error) {
	a := h.activationOf(r.ChildID)
	if a == nil {
		return protocol.StateReply{ChildID: r.ChildID, State: protocol.StateNone}, nil
	}
	st := protocol.StateReply{ChildID: r.ChildID, State: a.state(), HostID: h.id, RunID: a.runID}
	select {
	case <-a.built: // a.sess is set (or never will be) once built is closed
		if mr, ok := a.sess.(modelRetrier); ok && st.State == protocol.StateRunning {
			st.ModelRetry = mr.ModelRetry()
		}
		if bp, ok := a.sess.(budgetPauser); ok && st.State == protocol.StateRunning {
			if st.BudgetPause = bp.BudgetPause(); st.BudgetPause != nil {
				st.State = protocol.StatePaused
			}
		}
	default:
	}
	return st, nil
}

// modelRetrier is a session that pauses its turn to retry a model request
// that failed temporarily (*agent.Agent): ModelRetry is the retry it waits
// on, nil when none (docs/protocol.md §5.10, modelRetry).
type modelRetrier interface {
	ModelRetry() *protocol.ModelRetryData
}

// settleOverlapper is a session whose budget settlements may outlast its
// turn (*agent.Agent, OverlapSettles): a one-shot run's result is settled
// and published while its last settlement is in flight, and the host
// waits for them (WaitSettled) before it releases the lease, so a
// reservation taken at admission, which the session's live agent settles,
// is settled by it (docs/protocol.md §5.5, "Budgets").
type settleOverlapper interface {
	OverlapSettles()
	WaitSettled()
}

// waitSettled waits for s's budget settlements in flight, if it overlaps
// them with its run's end (settleOverlapper).
func waitSettled(s Session) {
	if o, ok := s.(settleOverlapper); ok {
		o.WaitSettled()
	}
}

// budgetPauser is a session whose turn pauses at its budget's cap
// (*agent.Agent): BudgetPause is the budget request it waits on, nil when
// none (docs/protocol.md §5.5, "Pause and raise"; state paused).
type budgetPauser interface {
	BudgetPause() *protocol.RequestOpenData
}

// dispose cancels a hosted run (cause disposed unless given) and answers with
// its settled status once it settled.
func (h *Host) dispose(ctx context.Context, req protocol.HostRunRequest) (any, error) {
	h.mu.Lock()
	r := h.runs[req.RunID]
	h.mu.Unlock()
	if r == nil {
		return nil, protocol.NewError(protocol.CodeNotFound, map[string]any{"what": "run " + req.RunID + " on host " + h.id})
	}
	cause := req.Cause
	if cause == "" {
		cause = protocol.CauseDisposed
	}
	r.cancel(&agent.Cancel{Cause: cause})
	select {
	case <-r.settled:
	case <-time.After(protocol.HostDisposeWaitMax):
		return nil, protocol.Errorf(protocol.CodeUnavailable, "run %s did not stop within %s", req.RunID, protocol.HostDisposeWaitMax)
	case <-ctx.Done():
		return nil, protocol.Errorf(protocol.CodeUnavailable, "host is stopping")
	}
	r.mu.Lock()
	res := r.result
	r.mu.Unlock()
	if res != nil {
		return protocol.RunStatus{RunID: r.runID, ChildID: r.childID, State: protocol.RunSettled, Result: res}, nil
	}
	rec, err := h.st.RunOf(ctx, r.req.Header.Provider, r.runID)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeUnavailable, "read run %s: %w", r.runID, err)
	}
	return protocol.RunStatus{RunID: r.runID, ChildID: r.childID, State: rec.Value.State, Result: rec.Value.Result}, nil
}

func (h *Host) activationOf(childID string) *activation {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.acts[childID]
}

// disposeActivation ends a resident activation's epoch (drains) and answers
// once it was torn down; an absent activation is already disposed.
func (h *Host) disposeActivation(ctx context.Context, childID, cause string) (any, error) {
	a := h.activationOf(childID)
	if a == nil {
		return protocol.StateReply{ChildID: childID, State: protocol.StateNone}, nil
	}
	if cause == "" {
		cause = protocol.CauseDisposed
	}
	a.stop(cause)
	select {
	case <-a.done:
	case <-time.After(protocol.HostDisposeWaitMax):
		return nil, protocol.NewError(protocol.CodeActivationTeardownFailed, map[string]any{
			"reason": fmt.Sprintf("activation of %s did not stop within %s", childID, protocol.HostDisposeWaitMax)})
	case <-ctx.Done():
		return nil, protocol.Errorf(protocol.CodeUnavailable, "host is stopping")
	}
	return protocol.StateReply{ChildID: childID, State: protocol.StateNone, RunID: a.runID}, nil
}
