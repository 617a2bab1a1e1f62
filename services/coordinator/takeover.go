package coordinator

// Takeover (docs/design.md §7, Settlement 2; RELIABILITY.md, I6): a session whose
// host stopped heartbeating is taken over by one coordinator (a
// compare-and-set on its lease), its open turn closed as interrupted with an
// append fenced on its log, and its run settled HOST_LOST by compare-and-set
// (a continuable child's epoch, and its pending messages resumed); a run
// record left running without a lease is settled as never started
// (orphans.go).

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// takeOver settles the run of a session whose host died (docs/design.md §7,
// Settlement 2): a one-shot run's (takeOverRun) or a continuable child's
// epoch (takeOverActivation), once the bucket's leader shows the lease
// still as judged and its host lost.
func (c *Coordinator) takeOver(ctx context.Context, l leaseState) {
	fresh, ok := c.takeoverDue(ctx, l)
	if !ok {
		return
	}
	switch fresh.Value.Kind {
	case protocol.AgentContinuable:
		c.takeOverActivation(ctx, fresh)
	case protocol.AgentOneShot:
		c.takeOverRun(ctx, fresh)
	}
}

// takeoverDue reads l's lease from the bucket's leader: ok when it is still
// the one judged (the same host and epoch) and its host is confirmed lost
// (hostLost), or the takeover is this replica's own, resumed.
func (c *Coordinator) takeoverDue(ctx context.Context, l leaseState) (store.Record[protocol.AgentRecord], bool) {
	fresh, err := c.st.LeaseLatest(ctx, l.rec.SessionID)
	if err != nil || fresh.Value.HostID != l.rec.HostID || fresh.Value.Epoch != l.rec.Epoch {
		return fresh, false // gone, or changed hands since we looked
	}
	if fresh.Value.TakenOverBy != c.cfg.ID && !c.hostLost(ctx, fresh.Value.HostID) {
		return fresh, false
	}
	return fresh, true
}

// takeOverRun settles a one-shot run whose host died: (i) CAS the lease to
// this replica, (ii) close the open turn as interrupted with an append
// fenced on the log's last record, (iii) settle the run `error`/HOST_LOST by
// CAS, (iv) publish, then release the lease. A turn that had already ended
// is settled with the result its log records.
func (c *Coordinator) takeOverRun(ctx context.Context, fresh store.Record[protocol.AgentRecord]) {
	id := fresh.Value.SessionID
	// Read from the bucket's leader: a replica that is not yet current (after
	// a restart or a partition) may not have the record, or its last write.
	run, err := c.st.RunLatest(ctx, fresh.Value.RunID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		_ = c.st.ReleaseLease(ctx, id, fresh.Revision)
		return
	case err != nil:
		c.log.Warn("takeover: read run", "run", fresh.Value.RunID, "err", err)
		return
	case run.Value.State == protocol.RunSettled:
		if run.Value.Result != nil {
			// The host settled, then died holding the lease: it may not have
			// published. Publishing again is harmless (subagent/end carries a
			// Nats-Msg-Id; a notice comes at least once, with the same result).
			c.publishEnd(run.Value, func(err error) { c.log.Warn("settled run not republished", "run", run.Value.RunID, "err", err) })
		}
		_ = c.st.ReleaseLease(ctx, id, fresh.Revision)
		return
	}
	deadHost := fresh.Value.HostID
	taken, ok := c.takeLease(ctx, fresh, protocol.ModeOneShot)
	if !ok {
		return // another replica won the lease
	}
	fence := protocol.TakeoverData{HostID: deadHost, By: c.cfg.ID, Epoch: taken.Value.Epoch}
	cont := c.continueRun(ctx, fence, run, taken)
	if c.continuing(id, cont) {
		return // continued on a live instance, or waiting for one: the lease stays taken over
	}
	deadHost = cont.lostOr(deadHost)
	events, err := c.closeInterrupted(ctx, id, fence, nil, false, c.holding(taken))
	if err != nil {
		c.closeFailed(id, err)
		return
	}
	res, err := c.takenOverResult(ctx, id, events, run.Value.Structured, deadHost)
	if err != nil {
		c.log.Warn("takeover: read header", "session", id, "err", err)
		return
	}
	cont.explain(&res)
	run.Value.Takeovers = int64(c.takeoversIn(ctx, id, events))
	// The run's end disposes its descendants before it settles, as its host
	// would have (internal/worker/ending.go); the lease, taken over, already
	// counts as ended for them.
	if _, err := c.disposeDescendants(ctx, id); err != nil {
		c.log.Warn("takeover: the run's descendants were not all disposed", "session", id, "err", err)
	}
	if !c.settleTakenOver(ctx, store.Settled(run.Value, c.cfg.ID, res), run.Revision, taken) {
		return // the lease stays taken over: the next sweep looks again
	}
	c.sweepRunBudgets(ctx, id, run.Value.RunID)
	if err := c.st.ReleaseLease(ctx, id, taken.Revision); err == nil {
		c.agents.del(store.LeaseKeyOf(taken.Value))
	}
}

// publishEnd publishes a settled run's subagent/start (again) and its end
// (subagent/end and the notice), waiting for both; onErr hears what was not
// acknowledged. Both carry their ids, so publishing again is idempotent.
func (c *Coordinator) publishEnd(rec protocol.RunRecord, onErr func(error)) {
	<-c.st.PublishStartAgain(rec, onErr)
	<-c.st.PublishRunEnd(rec, c.st.PublishRunNotice, onErr)
}

// takenOverResult is the result of a one-shot run taken over, from the
// session's events after its takeover was written: its host's when its turn
// had ended; HOST_LOST for a turn closed here, or none begun (the host died
// between its lease and its first turn: the log holds no turn/end).
func (c *Coordinator) takenOverResult(ctx context.Context, id string, events []protocol.SessionEvent, structured bool, deadHost string) (protocol.SubagentResult, error) {
	header, err := c.headers.get(ctx, c.st, id)
	if err != nil {
		return protocol.SubagentResult{}, err
	}
	own := events
	if header.SeedLength <= int64(len(events)) {
		own = events[header.SeedLength:]
	}
	res := sessionlog.OneShotOutcome(own, false, structured)
	if end, ended := sessionlog.LastTurnEnd(own); !ended || end.Reason.Kind == protocol.TurnInterrupted {
		done := "closed the open turn as interrupted"
		if !ended {
			done = "fenced its log (the child had not begun a turn)"
		}
		res.StopReason = protocol.StopError
		res.ErrorCode = protocol.CodeHostLost
		res.Diagnostic = fmt.Sprintf("host %s stopped heartbeating for more than %s; the coordinator %s", deadHost, c.cfg.HostExpiry, done)
	}
	return res, nil
}

// settleTakenOver settles rec, a one-shot run taken over at lease taken, by
// compare-and-set at runRev and publishes its end. It reports whether the
// lease is to be released now; false leaves it taken over, so the next
// sweep tries again (a settlement that failed, or one that won elsewhere
// and could not be read back to be published).
func (c *Coordinator) settleTakenOver(ctx context.Context, rec protocol.RunRecord, runRev uint64, taken store.Record[protocol.AgentRecord]) bool {
	onErr := func(err error) { c.log.Warn("lifecycle event not acknowledged", "err", err) }
	won, err := c.st.SettleRun(ctx, rec, runRev)
	switch {
	case err != nil:
		c.log.Warn("takeover: settle; will retry", "run", rec.RunID, "err", err)
		return false
	case won:
		c.settled(rec)
		c.publishEnd(rec, onErr)
		c.log.Info("run settled after host loss", "run", rec.RunID, "stopReason", rec.Result.StopReason, "errorCode", rec.Result.ErrorCode)
		return true
	}
	// Settled meanwhile: by the host before it died, or by a replica that
	// took this takeover over (the lease is then no longer ours). While the
	// lease is ours, its publication is ours: publish the record as it is,
	// then release; a lease that changed hands is left alone (the delete at
	// our revision is refused).
	l, err := c.st.LeaseLatest(ctx, taken.Value.SessionID)
	if err != nil || l.Revision != taken.Revision {
		return true
	}
	r, err := c.st.RunLatest(ctx, rec.RunID)
	if err != nil || r.Value.State != protocol.RunSettled || r.Value.Result == nil {
		return false
	}
	c.publishEnd(r.Value, onErr)
	return true
}

// takeLease takes over the lease fresh of a session whose host died, for
// this replica (store.TakeOverLease); false when another replica won it or
// it changed since. A lease this replica already took (a takeover resumed
// after a failure) is taken as it is.
func (c *Coordinator) takeLease(ctx context.Context, fresh store.Record[protocol.AgentRecord], mode string) (store.Record[protocol.AgentRecord], bool) {
	if fresh.Value.TakenOverBy == c.cfg.ID {
		return fresh, true
	}
	taken, err := c.st.TakeOverLease(ctx, fresh, c.cfg.ID)
	if err != nil {
		return fresh, false
	}
	c.agents.observe(taken.Value, taken.Revision)
	c.cfg.Metrics.TakeOver(mode)
	c.log.Warn("host lost; taking the session over", "session", fresh.Value.SessionID, "mode", mode, "host", fresh.Value.HostID, "run", fresh.Value.RunID)
	return taken, true
}

// closeInterrupted appends turn/end{interrupted} (and results for open tool
// calls) when the session's last turn is open, and agent/takeover (fence)
// when none is, fenced on the log's last record; a host that appended
// meanwhile makes it re-read and retry. Either way the lost host's next
// append is refused. desc is the descriptor of a continuable child's first
// epoch (RunRecord.Descriptor; nil otherwise): when the child's own events
// hold no subagent/descriptor yet (its host stopped between its lease and
// its first append), it is logged first, so the child stays resumable from
// its log (RELIABILITY.md, I6). With keepParked (a continuable child's
// takeover), a last turn parked on a request (sessionlog.Parked) is not
// closed: only agent/takeover is written, and the child's next activation
// continues the turn (docs/protocol.md §5.21, "After a restart"). It
// returns the session's events afterwards.
//
// The fence on the log's position alone does not tell whether the writer
// still may write: held is called after each read of the log and before the
// append that follows it, and its error (errSuperseded: the session moved
// on) stops the closing with nothing written. Every later holder of the
// session moves its lease before it writes the log, so a held that passed
// after the read leaves any later write to fence the append (chaos seed 1:
// a takeover stalled right after its lease compare-and-set, while another
// coordinator took the session over, released it and a worker resumed it,
// then closed the resumed epoch's open turn, fenced on its last record).
func (c *Coordinator) closeInterrupted(ctx context.Context, id string, fence protocol.TakeoverData, desc *protocol.DescriptorData, keepParked bool, held func(context.Context) error) ([]protocol.SessionEvent, error) {
	return c.fenceLog(ctx, id, fence, desc, func(evs []protocol.SessionEvent) ([]protocol.SessionEvent, error) { return closingOf(evs, keepParked) }, held)
}

// fenceLog is closeInterrupted with the closing of the log's open turn
// given by closeTurn (none: only agent/takeover is written, and the turn
// stays open for a host that continues it: continue.go).
func (c *Coordinator) fenceLog(ctx context.Context, id string, fence protocol.TakeoverData, desc *protocol.DescriptorData, closeTurn func([]protocol.SessionEvent) ([]protocol.SessionEvent, error), held func(context.Context) error) ([]protocol.SessionEvent, error) {
	// The header names the log's scope (and a seeded child's seed length).
	h, err := c.headers.get(ctx, c.st, id)
	if err != nil {
		return nil, fmt.Errorf("read the header of %s: %w", id, err)
	}
	for attempt := 0; attempt < TakeoverAttemptsMax; attempt++ {
		log, err := c.st.ReadLog(ctx, h.Scope(), id)
		if err != nil {
			return nil, err
		}
		first, err := descriptorFirst(log.Events, h.SeedLength, desc)
		if err != nil {
			return nil, err
		}
		closing, err := closeTurn(log.Events)
		if err != nil {
			return log.Events, err
		}
		if n := len(log.Events); len(closing) == 0 && n > 0 && isTakeover(log.Events[n-1], fence) {
			return log.Events, nil // this takeover, resumed: already written
		}
		if len(closing) == 0 {
			// No turn is open: the takeover is still written, so the lost
			// host's next append (a claim, a first turn) is refused (chaos
			// seed 2: a worker paused past the expiry claimed a prompt
			// after its activation had been ended, and the turn stayed open).
			ev, err := protocol.NewEvent(protocol.EvAgentTakeover, store.NowMs(), fence)
			if err != nil {
				return nil, err
			}
			closing = []protocol.SessionEvent{ev}
		}
		closing = append(first, closing...)
		if err := held(ctx); err != nil {
			return nil, err
		}
		w := c.st.NewLogWriter(h.Scope(), id, log.LastSubjSeq, int64(len(log.Events)))
		written, err := w.Append(ctx, closing...)
		if err == nil {
			return append(log.Events, written...), nil
		}
		if !errors.Is(err, store.ErrFenced) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("the log of %s kept changing during %d attempts", id, TakeoverAttemptsMax)
}

// closingOf returns the events that close the turn events leave open
// (interrupted, host-lost), none when no turn is open or, with keepParked,
// when the open turn is parked on a request (sessionlog.Parked: the
// child's next activation continues it).
func closingOf(events []protocol.SessionEvent, keepParked bool) ([]protocol.SessionEvent, error) {
	if _, parked := sessionlog.Parked(events); parked && keepParked {
		return nil, nil
	}
	return closeOpen(events)
}

// closeOpen returns the events that close the turn events leave open
// (interrupted, host-lost), none when no turn is open.
func closeOpen(events []protocol.SessionEvent) ([]protocol.SessionEvent, error) {
	return sessionlog.CloseOpenTurn(events, protocol.TurnEndReason{Kind: protocol.TurnInterrupted, Cause: protocol.CauseHostLost}, store.NowMs())
}

// descriptorFirst returns the subagent/descriptor a continuable child's
// log must get before its closing (closeInterrupted): desc, when the
// child's own events (after its seed of seedLength) hold none; nothing else.
func descriptorFirst(events []protocol.SessionEvent, seedLength int64, desc *protocol.DescriptorData) ([]protocol.SessionEvent, error) {
	if desc == nil || sessionlog.Mode(events, seedLength) != "" {
		return nil, nil
	}
	ev, err := protocol.NewEvent(protocol.EvSubagentDescriptor, store.NowMs(), *desc)
	if err != nil {
		return nil, err
	}
	return []protocol.SessionEvent{ev}, nil
}

// errSuperseded: the session a takeover or a settlement meant to close moved
// on since (its lease was taken by another party, released, or taken by a
// later epoch); the closing is not this replica's any more.
var errSuperseded = errors.New("superseded: the session's lease moved on")

// holding returns the check closeInterrupted makes before each append of a
// takeover: the lease, read from the bucket's leader, is still the one this
// replica took (at taken's revision). A lease that is gone or moved is
// errSuperseded; a read that failed is its error (the takeover is retried).
func (c *Coordinator) holding(taken store.Record[protocol.AgentRecord]) func(context.Context) error {
	return func(ctx context.Context) error {
		l, err := c.st.LeaseLatest(ctx, taken.Value.SessionID)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("%w: the lease taken at revision %d is gone", errSuperseded, taken.Revision)
		case err != nil:
			return fmt.Errorf("read the lease of %s: %w", taken.Value.SessionID, err)
		case l.Revision != taken.Revision:
			return fmt.Errorf("%w: the lease taken at revision %d is at %d, held by %s", errSuperseded, taken.Revision, l.Revision, l.Value.HostID)
		}
		return nil
	}
}

// noLaterEpoch returns the check closeInterrupted makes before each append
// of an orphan's settlement, which holds no lease: no lease of the session
// names another run than runID (a later epoch, whose log it is now).
func (c *Coordinator) noLaterEpoch(id, runID string) func(context.Context) error {
	return func(ctx context.Context) error {
		l, err := c.st.LeaseLatest(ctx, id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return nil
		case err != nil:
			return fmt.Errorf("read the lease of %s: %w", id, err)
		case l.Value.RunID != runID:
			return fmt.Errorf("%w: run %s holds the lease", errSuperseded, l.Value.RunID)
		}
		return nil
	}
}

// closeFailed logs why a takeover's closeInterrupted failed: superseded, it
// stops for good (the lease is another's); else the next sweep retries.
func (c *Coordinator) closeFailed(id string, err error) {
	if errors.Is(err, errSuperseded) {
		c.log.Info("takeover superseded; leaving the session to its new holder", "session", id, "err", err)
		return
	}
	c.log.Warn("takeover: could not close the open turn; will retry", "session", id, "err", err)
}

// isTakeover reports whether ev is the agent/takeover of fence's coordinator and epoch.
func isTakeover(ev protocol.SessionEvent, fence protocol.TakeoverData) bool {
	var d protocol.TakeoverData
	return ev.Type == protocol.EvAgentTakeover && ev.Decode(&d) == nil && d.By == fence.By && d.Epoch == fence.Epoch
}

// takeOverActivation ends the epoch of a continuable child whose host died.
// The child is not failed: its turn in flight is closed as interrupted, the
// epoch settles (aborted, HOST_LOST), the parent gets its notice and the
// ownership edge is released, and accepted items still in the inbox are
// resumed on a live host (docs/design.md §7, Settlement 2; §4, Liveness).
// An epoch whose turn is open (not parked) is first offered to a live
// instance, which continues it in the same epoch (continue.go; issue 31,
// item 2); only when none does within ContinueWaitMax is it ended here.
func (c *Coordinator) takeOverActivation(ctx context.Context, fresh store.Record[protocol.AgentRecord]) {
	id := fresh.Value.SessionID
	deadHost := fresh.Value.HostID
	taken, ok := c.takeLease(ctx, fresh, protocol.ModeContinuable)
	if !ok {
		return // another replica won the lease
	}
	// The epoch record is read from the bucket's leader (a replica not yet
	// current may lack it, or its last write) before the log is closed: a
	// first epoch's record carries the descriptor the log may still lack.
	run, runErr := c.st.RunLatest(ctx, fresh.Value.RunID)
	if runErr != nil && !errors.Is(runErr, store.ErrNotFound) {
		c.log.Warn("takeover: read the epoch record; will retry", "session", id, "run", fresh.Value.RunID, "err", runErr)
		return
	}
	fence := protocol.TakeoverData{HostID: deadHost, By: c.cfg.ID, Epoch: taken.Value.Epoch}
	var cont continuation
	if runErr == nil && run.Value.State == protocol.RunRunning {
		// An epoch whose turn is open is continued on a live instance as a
		// one-shot run is (continue.go); the epoch goes on there.
		cont = c.continueRun(ctx, fence, run, taken)
		if c.continuing(id, cont) {
			return
		}
		deadHost = cont.lostOr(deadHost)
	}
	events, err := c.closeInterrupted(ctx, id, fence, run.Value.Descriptor, true, c.holding(taken))
	if err != nil {
		c.closeFailed(id, err)
		return
	}
	res, n := takenOverEpochResult(events, fresh.Value.EpochStart, deadHost)
	run.Value.Takeovers = n
	cont.explain(&res)
	if errors.Is(runErr, store.ErrNotFound) {
		run = store.Record[protocol.RunRecord]{} // nothing to settle
	}
	epochRec, settled, ok := c.settleTakenOverEpoch(ctx, run, res)
	if !ok {
		return
	}
	c.sweepRunBudgets(ctx, id, fresh.Value.RunID)
	// Published before the lease goes, as a host does: a replica that dies
	// here is taken over in turn and publishes again.
	if settled && !c.publishEpochEnd(ctx, fresh.Value, epochRec) {
		return
	}
	if err := c.st.ReleaseLease(ctx, id, taken.Revision); err != nil {
		c.log.Warn("takeover: could not release the lease", "session", id, "err", err)
		return
	}
	c.agents.del(store.LeaseKeyOf(taken.Value))
	c.resumePending(ctx, id)
}

// takenOverEpochResult is the result of a continuable child's epoch
// taken over after its host deadHost died, from the child's events (the
// epoch's begin at epochStart), and the epoch's agent/takeover records: a
// turn closed interrupted ends it HOST_LOST; a turn parked on a request,
// left open for the next epoch, ends it aborted HOST_LOST.
func takenOverEpochResult(events []protocol.SessionEvent, epochStart int64, deadHost string) (protocol.SubagentResult, int64) {
	epoch := events
	if epochStart <= int64(len(events)) {
		epoch = events[epochStart:]
	}
	res := sessionlog.EpochOutcome(epoch)
	if end, ok := sessionlog.LastTurnEnd(epoch); ok && end.Reason.Kind == protocol.TurnInterrupted {
		res.ErrorCode = protocol.CodeHostLost
		res.Diagnostic = fmt.Sprintf("host %s stopped heartbeating; the turn in flight was closed as interrupted and accepted messages resume on another host", deadHost)
	}
	if p, parked := sessionlog.Parked(events); parked {
		// The turn is left open for the child's next epoch, which continues
		// it: this epoch ends as one whose turn its host lost.
		res.StopReason, res.ErrorCode = protocol.StopAborted, protocol.CodeHostLost
		res.Diagnostic = fmt.Sprintf("host %s stopped heartbeating while turn %d waited for the answer to a request; the turn continues from the log on another host", deadHost, p.Turn)
	}
	return res, int64(takeovers(epoch))
}

// settleTakenOverEpoch settles the epoch record run (zero when there is
// none) of a continuable child taken over with result res. The epoch record
// is settled before the lease goes: a lease released over a record still
// running leaves it running for good, since no one holds the session any
// more. ok false: the settlement failed and the lease stays taken over (the
// next sweep tries again). settled says whether the epoch has an end to
// publish: the one written here, or the one of a host that settled the
// epoch, then died holding the lease (it publishes before it releases),
// whose record (and result) epochRec then is; an epoch that never started
// has no end.
func (c *Coordinator) settleTakenOverEpoch(ctx context.Context, run store.Record[protocol.RunRecord], res protocol.SubagentResult) (epochRec protocol.RunRecord, settled, ok bool) {
	switch {
	case run.Value.State == protocol.RunRunning:
		rec := store.Settled(run.Value, c.cfg.ID, res)
		if won, err := c.st.SettleRun(ctx, rec, run.Revision); err != nil || !won {
			c.log.Warn("takeover: settle the epoch; will retry", "session", rec.ChildID, "run", rec.RunID, "err", err)
			return rec, false, false
		}
		c.settled(rec)
		return rec, true, true
	case run.Value.Result != nil:
		return run.Value, !run.Value.NotStarted, true
	}
	return protocol.RunRecord{}, false, true
}

// publishEpochEnd publishes the end of the epoch epochRec of lease's child,
// taken over, again (idempotently: the notice and subagent/end carry their
// ids) and removes its ownership edge (store.EndEpoch). It reports whether
// the lease may go: an edge left behind keeps the owner waiting for good,
// so the lease stays taken over, and the next sweep publishes the settled
// epoch's end again and removes it.
func (c *Coordinator) publishEpochEnd(ctx context.Context, lease protocol.AgentRecord, epochRec protocol.RunRecord) bool {
	// A child under an ended one-shot run gives its parent, disposed by the
	// same end, no notice (store.EndEpoch); a failed read is taken as "not
	// ended", as the host does.
	anc, err := c.st.EndedAncestor(ctx, lease.Ancestry)
	if err != nil {
		c.log.Warn("takeover: could not check whether an ancestor ended", "session", lease.SessionID, "err", err)
	}
	<-c.st.PublishStartAgain(epochRec, func(err error) { c.log.Warn("epoch start not republished", "err", err) })
	var ownershipKept atomic.Bool
	<-c.st.EndEpoch(ctx, store.EpochEnd{
		ChildID: lease.SessionID, Parent: lease.ParentSession, Owner: lease.Owner, RunID: lease.RunID,
		Provider: lease.Provider, Remote: c.isRemote(lease.Provider), Result: *epochRec.Result, AncestorEnded: anc != "",
		Takeovers: epochRec.Takeovers,
	}, func(err error) {
		ownershipKept.CompareAndSwap(false, errors.Is(err, store.ErrOwnershipKept))
		c.log.Warn("epoch end not fully published", "err", err)
	})
	if ownershipKept.Load() {
		c.log.Warn("takeover: the ownership edge was not removed; will retry", "session", lease.SessionID, "owner", lease.Owner)
		return false
	}
	return true
}
