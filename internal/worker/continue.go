package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/pkg/protocol"
)

// continueRun serves `provider.<name>.<hostId>.continue`
// (protocol.ProviderContinueRequest; docs/protocol.md §8.4, "Continued
// after a host loss"): a one-shot run whose host died in the middle of its
// turn, its lease taken over by a coordinator at the next epoch and its
// log fenced with agent/takeover, the turn left open, is continued here.
// The header comes with the request (a worker reads none). In order:
// the lease is read from the bucket's leader and must be the one
// the coordinator took (at req.LeaseRevision, taken over, naming the run),
// the run record must be running; the log is read and the child composed
// over it as its first host composed it (the options its descriptor
// logged); the session must be a ContinuingSession (else INVALID_ARGUMENT:
// nothing was written, the coordinator ends the run HOST_LOST); then the
// lease is taken by compare-and-set at req.LeaseRevision, with this host
// and a fresh credential (NOT_PENDING when it moved), and only then is the
// run this host's: it answers, and the turn continues (Agent.ContinueTurn)
// and settles as any run of this host (execute, settleRun). The log is
// written only after the lease's compare-and-set, fenced on the last
// record read: a coordinator that gave up and closed the turn before it
// fences this host out (the run then settles once, by the record's
// compare-and-set).
func (h *Host) continueRun(ctx context.Context, p Provider, req protocol.ProviderContinueRequest) (any, error) {
	if h.isDraining() {
		return nil, protocol.Errorf(protocol.CodeDraining, "host %s is draining", h.id)
	}
	if p.Descriptor().Remote {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "provider %s is remote: its runs are not continued after a host loss (docs/protocol.md §8.4)", req.Provider)
	}
	if !protocol.ValidID(req.ChildID) || !protocol.ValidID(req.RunID) || req.LeaseRevision == 0 || req.Provider != p.Descriptor().Name {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "continue needs valid runId and childId, the lease's revision and this provider's name (docs/protocol.md §9.3)")
	}
	cctx, cancel, err := h.withDeadline(ctx, req.Deadline, "continue", req.RunID)
	if err != nil {
		return nil, err
	}
	defer cancel()
	header := req.Header
	if header.ID != req.ChildID {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "header.id must equal childId")
	}
	if err := inScope(p, header); err != nil {
		return nil, err
	}
	lease, err := h.st.ChildLeaseLatest(cctx, header.Provider, req.ChildID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, notContinued(req.RunID, "the session has no lease")
	case err != nil:
		return nil, protocol.Errorf(protocol.CodeUnavailable, "read the lease of %s: %w", req.ChildID, err)
	case lease.Revision != uint64(req.LeaseRevision) || lease.Value.TakenOverBy == "" || lease.Value.RunID != req.RunID ||
		(lease.Value.Kind != protocol.AgentOneShot && lease.Value.Kind != protocol.AgentContinuable):
		return nil, notContinued(req.RunID, "the session's lease is not the one taken over for this run any more")
	}
	run, err := h.st.RunLatestOf(cctx, header.Provider, req.RunID)
	switch {
	case err != nil:
		return nil, protocol.Errorf(protocol.CodeUnavailable, "read run %s: %w", req.RunID, err)
	case run.Value.State != protocol.RunRunning || run.Value.ChildID != req.ChildID:
		return nil, notContinued(req.RunID, "the run is not running")
	}
	if lease.Value.Kind == protocol.AgentContinuable {
		return h.continueActivation(ctx, cctx, p, req, lease, run)
	}
	log, err := h.st.ReadLog(cctx, header.Scope(), req.ChildID)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeUnavailable, "read the log of %s: %w", req.ChildID, err)
	}
	cred := protocol.NewCredential()
	wctx, cancelWrites := runWrites(ctx)
	defer cancelWrites()
	lw := h.st.NewLogWriter(header.Scope(), req.ChildID, log.LastSubjSeq, int64(len(log.Events)))
	sess, err := p.NewSession(wctx, SessionSpec{Header: header, Options: loggedOptions(log.Events, header.SeedLength), Credential: cred, Log: lw, Events: log.Events})
	if err != nil {
		return nil, err
	}
	if _, ok := sess.(ContinuingSession); !ok {
		closeSession(sess)
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "provider %s's sessions cannot continue a turn (docs/protocol.md §8.4)", req.Provider)
	}
	mine := lease.Value
	mine.HostID, mine.TakenOverBy, mine.CredentialHash = h.id, "", protocol.HashCredential(cred)
	leaseRev, err := h.st.UpdateLease(wctx, mine, lease.Revision)
	if err != nil {
		closeSession(sess)
		if errors.Is(err, store.ErrConflict) {
			return nil, notContinued(req.RunID, "another party moved the session's lease")
		}
		return nil, protocol.Errorf(protocol.CodeUnavailable, "take the lease of %s: %w", req.ChildID, err)
	}
	h.log.Warn("continuing a run whose host died", "run", req.RunID, "session", req.ChildID, "epoch", mine.Epoch, "lostHost", run.Value.HostID)
	base, span := telemetry.StartRun(context.WithoutCancel(ctx), req.Provider, protocol.ModeOneShot, req.RunID, header)
	runCtx, cancelRun := context.WithCancelCause(base)
	// subagent/start was published by the run's first host, unless it died
	// first: a copy under the same Nats-Msg-Id is stored only if that one
	// is not, and stored now it keeps a late first publication (a paused
	// host resumed) from landing after this host's end (I7; chaos
	// TestYourProviderUnderFaults, seed 11).
	started := h.st.PublishStartAgain(run.Value, h.eventErr)
	r := &hostedRun{
		runID: req.RunID, childID: req.ChildID, remote: p.Descriptor().Remote, run: run.Value, runRev: run.Revision,
		req:   protocol.ProviderStartRequest{RunID: req.RunID, Header: header, Provider: req.Provider, Options: loggedOptions(log.Events, header.SeedLength)},
		epoch: mine.Epoch, seedLen: header.SeedLength, sess: sess, ctx: runCtx, cancel: cancelRun,
		settled: make(chan struct{}), done: make(chan struct{}), span: span, started: started,
		lease: mine, leaseRev: leaseRev, cred: cred, continued: true, takeovers: takeoversOf(log.Events, header.SeedLength), lw: lw,
	}
	h.mu.Lock()
	h.runs[r.runID] = r
	draining := h.draining
	h.mu.Unlock()
	if draining {
		// The lease is this host's now: the turn ends as a drain ends any
		// run it disposes (aborted), and settles.
		cancelRun(&agent.Cancel{Cause: protocol.CauseDisposed})
	}
	if h.turns != nil {
		h.turns.Go(func() { h.execute(r) })
	} else {
		go h.execute(r)
	}
	return protocol.ProviderStartReply{HostID: h.id}, nil
}

// continueActivation is continueRun for the epoch of a continuable child
// whose host died with a turn open (not parked on a request: the child's
// next activation continues that one, docs/protocol.md §5.21): the lease
// (of kind continuable, taken over at req.LeaseRevision) and the epoch's
// run record (running) were checked. The activation is registered and
// built as activate builds one over the child's log (its options from its
// logged subagent/descriptor, its owner and ancestry the lease's, the
// epoch's events from the lease's epochStart), its wake subscribed; the
// session must be a ContinuingSession. Then the lease is taken by
// compare-and-set at req.LeaseRevision (NOT_PENDING when it moved), and
// the epoch is this host's: its loop continues the open turn first
// (Agent.ContinueTurn), then claims what the inbox holds as any epoch's
// does, and the epoch settles once (teardown: the record's compare-and-set
// at the revision read here), so the owner gets one notice for it.
func (h *Host) continueActivation(ctx, cctx context.Context, p Provider, req protocol.ProviderContinueRequest, lease store.Record[protocol.AgentRecord], run store.Record[protocol.RunRecord]) (any, error) {
	header := req.Header
	a := &activation{
		h: h, childID: req.ChildID, header: header, provider: req.Provider, remote: false, runID: req.RunID,
		run: run.Value, runRev: run.Revision, epoch: lease.Value.Epoch, owner: lease.Value.Owner, began: time.Now(),
		inbox: h.inboxOf(header), wake: make(chan struct{}, 1), built: make(chan struct{}), done: make(chan struct{}),
		continued: true,
	}
	base, span := telemetry.StartRun(context.WithoutCancel(ctx), req.Provider, protocol.ModeContinuable, req.RunID, header)
	a.ctx, a.dispose = context.WithCancelCause(base)
	a.span = span
	h.mu.Lock()
	if cur := h.acts[req.ChildID]; cur != nil || h.draining {
		h.mu.Unlock()
		var err error = protocol.Errorf(protocol.CodeDraining, "host %s is draining", h.id)
		if cur != nil {
			err = notContinued(req.RunID, fmt.Sprintf("session %s is already resident on host %s", req.ChildID, h.id))
		}
		a.dispose(err)
		telemetry.EndRun(span, nil, err)
		return nil, err
	}
	h.acts[req.ChildID] = a
	h.mu.Unlock()
	var sess Session
	fail := func(err error) (any, error) {
		h.mu.Lock()
		if h.acts[req.ChildID] == a {
			delete(h.acts, req.ChildID)
		}
		h.mu.Unlock()
		a.unsubscribe()
		if sess != nil {
			closeSession(sess)
		}
		a.dispose(err)
		telemetry.EndRun(span, nil, err)
		close(a.built)
		close(a.done)
		return nil, err
	}
	log, err := h.st.ReadLog(cctx, header.Scope(), req.ChildID)
	if err != nil {
		return fail(protocol.Errorf(protocol.CodeUnavailable, "read the log of %s: %w", req.ChildID, err))
	}
	if _, parked := sessionlog.Parked(log.Events); parked {
		return fail(notContinued(req.RunID, "the turn is parked on a request: the child's next activation continues it"))
	}
	cred := protocol.NewCredential()
	wctx, cancelWrites := runWrites(ctx)
	defer cancelWrites()
	lw := h.st.NewLogWriter(header.Scope(), req.ChildID, log.LastSubjSeq, int64(len(log.Events)))
	opts := loggedOptions(log.Events, header.SeedLength)
	opts.OutputSchema = ""
	a.dirty.Store(true)
	sess, err = p.NewSession(wctx, SessionSpec{
		Header: header, Options: opts, Credential: cred, Log: lw, Events: log.Events,
		Continuable: true, Inbox: a.inbox, InboxDirty: func() bool { return a.dirty.Swap(false) },
	})
	if err != nil {
		sess = nil
		return fail(err)
	}
	cs, ok := sess.(ContinuableSession)
	if _, cont := sess.(ContinuingSession); !ok || !cont {
		return fail(protocol.Errorf(protocol.CodeInvalidArgument, "provider %s's continuable sessions cannot continue a turn (docs/protocol.md §8.4)", req.Provider))
	}
	a.sess = cs
	a.start = int(min(max(lease.Value.EpochStart, 0), int64(len(log.Events))))
	if err := h.subscribeActivation(a); err != nil {
		return fail(err)
	}
	mine := lease.Value
	mine.HostID, mine.TakenOverBy, mine.CredentialHash = h.id, "", protocol.HashCredential(cred)
	leaseRev, err := h.st.UpdateLease(wctx, mine, lease.Revision)
	if err != nil {
		if errors.Is(err, store.ErrConflict) {
			return fail(notContinued(req.RunID, "another party moved the session's lease"))
		}
		return fail(protocol.Errorf(protocol.CodeUnavailable, "take the lease of %s: %w", req.ChildID, err))
	}
	a.mu.Lock()
	a.leaseRev = leaseRev
	a.mu.Unlock()
	h.log.Warn("continuing an epoch whose host died", "run", req.RunID, "session", req.ChildID, "epoch", mine.Epoch, "lostHost", run.Value.HostID)
	// As continueRun's: a copy of subagent/start under its first
	// publication's Nats-Msg-Id, stored only if that one is not.
	a.started = h.st.PublishStartAgain(run.Value, h.eventErr)
	close(a.built)
	go a.loop()
	return protocol.ProviderStartReply{HostID: h.id}, nil
}

// notContinued is the NOT_PENDING answer of a continue this host does not
// take: the run is not waiting for a host any more.
func notContinued(runID, reason string) error {
	return protocol.NewError(protocol.CodeNotPending, map[string]any{"runId": runID, "reason": reason})
}

// loggedOptions returns the options a one-shot child was composed with, as
// its first host logged them in its subagent/descriptor (after any seed of
// seedLength events); none when the log holds no descriptor.
func loggedOptions(events []protocol.SessionEvent, seedLength int64) protocol.ResolvedOptions {
	for _, ev := range ownEvents(events, seedLength) {
		if ev.Type != protocol.EvSubagentDescriptor {
			continue
		}
		var d protocol.DescriptorData
		if ev.Decode(&d) != nil {
			break
		}
		return protocol.ResolvedOptions{OutputSchema: d.OutputSchema, ToolFilter: d.ToolFilter, Persona: d.Persona, Label: d.Label}
	}
	return protocol.ResolvedOptions{}
}

// takeoversOf counts the agent/takeover records of a session's own events
// (after its seed of seedLength events): the times its host was lost.
func takeoversOf(events []protocol.SessionEvent, seedLength int64) int {
	n := 0
	for _, ev := range ownEvents(events, seedLength) {
		if ev.Type == protocol.EvAgentTakeover {
			n++
		}
	}
	return n
}

func ownEvents(events []protocol.SessionEvent, seedLength int64) []protocol.SessionEvent {
	if seedLength > 0 && seedLength <= int64(len(events)) {
		return events[seedLength:]
	}
	return events
}
