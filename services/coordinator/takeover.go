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
	"time"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// holderDead reports whether the lease's holder stopped heartbeating: a
// worker past the expiry, or a coordinator that died during a takeover
// (judged by the registry, on evidence about the holder only). A takeover of
// this replica's own that did not finish counts too, so it is resumed. A
// holder never seen heartbeating is judged from when the lease was first
// seen, on the same observed clock.
func (c *Coordinator) holderDead(l leaseState) bool {
	if l.rec.TakenOverBy == c.cfg.ID {
		return true
	}
	_, live, known := c.reg.hostKnown(l.rec.HostID)
	if known {
		return !live
	}
	return c.reg.expired(l.firstObs)
}

// hostLostWait bounds hostLost's read of a host record from the bucket's
// leader; a read that did not answer in time decides nothing (the next
// sweep asks again).
const hostLostWait = 2 * time.Second

// hostLost confirms, before this replica acts on the death of host id (a
// takeover of its session, the settlement of a run it claimed), that the
// record the registry judged it on is the host's latest: it reads the
// host's record from the bucket's leader. A newer one (a heartbeat the
// hosts watch did not deliver: the watch silent or opened again through an
// election of brood_hosts, a snapshot that missed the key) makes the host
// live again from now (registry.confirm), and nothing is done; no record at
// the leader confirms the loss; a read that failed (the bucket electing)
// decides nothing now. A host is declared lost only on a record read fresh
// (issue 16: a run settled HOST_LOST 0.2 s after its coordinator opened its
// watches again, while its host heartbeated).
func (c *Coordinator) hostLost(ctx context.Context, id string) bool {
	rctx, cancel := context.WithTimeout(ctx, hostLostWait)
	defer cancel()
	rec, err := store.GetLatest[protocol.HostRecord](rctx, c.st.Hosts, store.HostKey(id))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return true
	case err != nil:
		c.log.Info("a host judged lost could not be read from the leader; deciding at the next sweep", "host", id, "err", err)
		return false
	}
	if c.reg.confirm(store.HostKey(id), rec.Value, rec.Revision) {
		c.log.Warn("a host judged lost heartbeated after the record this replica had; keeping it live", "host", id)
		return false
	}
	return true
}

// takeOver settles the run of a session whose host died (docs/design.md §7,
// Settlement 2): (i) CAS the lease to this replica, (ii) close the open turn
// as interrupted with an append fenced on the log's last record, (iii) settle
// the run `error`/HOST_LOST by CAS, (iv) publish, then release the lease. A
// turn that had already ended is settled with the result its log records.
func (c *Coordinator) takeOver(ctx context.Context, l leaseState) {
	id := l.rec.SessionID
	fresh, err := c.st.LeaseLatest(ctx, id)
	if err != nil || fresh.Value.HostID != l.rec.HostID || fresh.Value.Epoch != l.rec.Epoch {
		return // gone, or changed hands since we looked
	}
	if fresh.Value.TakenOverBy != c.cfg.ID && !c.hostLost(ctx, fresh.Value.HostID) {
		return
	}
	if fresh.Value.Kind == protocol.AgentContinuable {
		c.takeOverActivation(ctx, fresh)
		return
	}
	if fresh.Value.Kind != protocol.AgentOneShot {
		return
	}
	// Read from the bucket's leader: a replica that is not yet current (after
	// a restart or a partition) may not have the record, or its last write.
	run, err := c.st.RunLatest(ctx, fresh.Value.RunID)
	if err == nil && run.Value.State == protocol.RunSettled && run.Value.Result != nil {
		// The host settled, then died holding the lease: it may not have
		// published. Publishing again is harmless (subagent/end carries a
		// Nats-Msg-Id; a notice comes at least once, with the same result).
		onErr := func(err error) { c.log.Warn("settled run not republished", "run", run.Value.RunID, "err", err) }
		<-c.st.PublishStartAgain(run.Value, onErr)
		<-c.st.PublishRunEnd(run.Value, c.st.PublishRunNotice, onErr)
	}
	if errors.Is(err, store.ErrNotFound) || (err == nil && run.Value.State == protocol.RunSettled) {
		_ = c.st.ReleaseLease(ctx, id, fresh.Revision)
		return
	}
	if err != nil {
		c.log.Warn("takeover: read run", "run", fresh.Value.RunID, "err", err)
		return
	}
	deadHost := fresh.Value.HostID
	taken, ok := c.takeLease(ctx, fresh, protocol.ModeOneShot)
	if !ok {
		return // another replica won the lease
	}
	events, err := c.closeInterrupted(ctx, id, protocol.TakeoverData{HostID: deadHost, By: c.cfg.ID, Epoch: taken.Value.Epoch}, nil, c.holding(taken))
	if err != nil {
		c.closeFailed(id, err)
		return
	}
	header, err := c.headers.get(ctx, c.st, id)
	if err != nil {
		c.log.Warn("takeover: read header", "session", id, "err", err)
		return
	}
	own := events
	if header.SeedLength <= int64(len(events)) {
		own = events[header.SeedLength:]
	}
	res := sessionlog.OneShotOutcome(own, false, run.Value.Structured)
	// The run's result is its host's only when its turn had ended; a turn
	// closed here, or none begun (the host died between its lease and its
	// first turn: the log holds no turn/end), is HOST_LOST.
	if end, ended := sessionlog.LastTurnEnd(own); !ended || end.Reason.Kind == protocol.TurnInterrupted {
		done := "closed the open turn as interrupted"
		if !ended {
			done = "fenced its log (the child had not begun a turn)"
		}
		res.StopReason = protocol.StopError
		res.ErrorCode = protocol.CodeHostLost
		res.Diagnostic = fmt.Sprintf("host %s stopped heartbeating for more than %s; the coordinator %s", deadHost, c.cfg.HostExpiry, done)
	}
	// The run's end disposes its descendants before it settles, as its host
	// would have (internal/worker/ending.go); the lease, taken over, already
	// counts as ended for them.
	if _, err := c.disposeDescendants(ctx, id); err != nil {
		c.log.Warn("takeover: the run's descendants were not all disposed", "session", id, "err", err)
	}
	rec := store.Settled(run.Value, c.cfg.ID, res)
	onErr := func(err error) { c.log.Warn("lifecycle event not acknowledged", "err", err) }
	won, err := c.st.SettleRun(ctx, rec, run.Revision)
	switch {
	case err == nil && !won:
		// Settled meanwhile: by the host before it died, or by a replica
		// that took this takeover over (the lease is then no longer ours).
		// While the lease is ours, its publication is ours: publish the
		// record as it is, then release; a lease that changed hands is
		// left alone (the delete at our revision is refused).
		if l, err := c.st.LeaseLatest(ctx, id); err == nil && l.Revision == taken.Revision {
			r, err := c.st.RunLatest(ctx, rec.RunID)
			if err != nil || r.Value.State != protocol.RunSettled || r.Value.Result == nil {
				return // the lease stays taken over: the next sweep looks again
			}
			<-c.st.PublishStartAgain(r.Value, onErr)
			<-c.st.PublishRunEnd(r.Value, c.st.PublishRunNotice, onErr)
		}
	case err != nil:
		// Not settled: the lease stays taken over, so the next sweep tries
		// again.
		c.log.Warn("takeover: settle; will retry", "run", rec.RunID, "err", err)
		return
	default:
		c.settled(rec)
		<-c.st.PublishStartAgain(rec, onErr)
		<-c.st.PublishRunEnd(rec, c.st.PublishRunNotice, onErr)
		c.log.Info("run settled after host loss", "run", rec.RunID, "stopReason", res.StopReason, "errorCode", res.ErrorCode)
	}
	if err := c.st.ReleaseLease(ctx, id, taken.Revision); err == nil {
		c.agents.del(store.LeaseKeyOf(taken.Value))
	}
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
// its log (RELIABILITY.md, I6). It returns the session's events afterwards.
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
func (c *Coordinator) closeInterrupted(ctx context.Context, id string, fence protocol.TakeoverData, desc *protocol.DescriptorData, held func(context.Context) error) ([]protocol.SessionEvent, error) {
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
		var first []protocol.SessionEvent
		if desc != nil {
			if sessionlog.Mode(log.Events, h.SeedLength) == "" {
				ev, err := protocol.NewEvent(protocol.EvSubagentDescriptor, store.NowMs(), *desc)
				if err != nil {
					return nil, err
				}
				first = append(first, ev)
			}
		}
		closing, err := sessionlog.CloseOpenTurn(log.Events, protocol.TurnEndReason{Kind: protocol.TurnInterrupted, Cause: protocol.CauseHostLost}, store.NowMs())
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
	events, err := c.closeInterrupted(ctx, id, protocol.TakeoverData{HostID: deadHost, By: c.cfg.ID, Epoch: taken.Value.Epoch}, run.Value.Descriptor, c.holding(taken))
	if err != nil {
		c.closeFailed(id, err)
		return
	}
	epoch := events
	if fresh.Value.EpochStart <= int64(len(events)) {
		epoch = events[fresh.Value.EpochStart:]
	}
	res := sessionlog.EpochOutcome(epoch)
	if end, ok := sessionlog.LastTurnEnd(epoch); ok && end.Reason.Kind == protocol.TurnInterrupted {
		res.ErrorCode = protocol.CodeHostLost
		res.Diagnostic = fmt.Sprintf("host %s stopped heartbeating; the turn in flight was closed as interrupted and accepted messages resume on another host", deadHost)
	}
	// The epoch record is settled before the lease goes: a lease released
	// over a record still running leaves it running for good, since no one
	// holds the session any more. A failed settlement keeps the lease taken
	// over, and the next sweep tries again.
	settled := false
	var epochRec protocol.RunRecord
	switch {
	case errors.Is(runErr, store.ErrNotFound): // nothing to settle
	case run.Value.State == protocol.RunRunning:
		rec := store.Settled(run.Value, c.cfg.ID, res)
		if won, err := c.st.SettleRun(ctx, rec, run.Revision); err != nil || !won {
			c.log.Warn("takeover: settle the epoch; will retry", "session", id, "run", rec.RunID, "err", err)
			return
		}
		settled, epochRec = true, rec
		c.settled(rec)
	case run.Value.Result != nil:
		// The host settled the epoch, then died holding the lease (it
		// publishes before it releases): publish its end again, idempotently
		// (the notice and subagent/end carry their ids), with its result;
		// an epoch that never started has no end.
		settled, res, epochRec = !run.Value.NotStarted, *run.Value.Result, run.Value
	}
	// Published before the lease goes, as a host does: a replica that dies
	// here is taken over in turn and publishes again.
	if settled {
		// A child under an ended one-shot run gives its parent, disposed by
		// the same end, no notice (store.EndEpoch); a failed read is taken
		// as "not ended", as the host does.
		anc, err := c.st.EndedAncestor(ctx, fresh.Value.Ancestry)
		if err != nil {
			c.log.Warn("takeover: could not check whether an ancestor ended", "session", id, "err", err)
		}
		<-c.st.PublishStartAgain(epochRec, func(err error) { c.log.Warn("epoch start not republished", "err", err) })
		var ownershipKept atomic.Bool
		<-c.st.EndEpoch(ctx, store.EpochEnd{
			ChildID: id, Parent: fresh.Value.ParentSession, Owner: fresh.Value.Owner, RunID: fresh.Value.RunID,
			Provider: fresh.Value.Provider, Remote: c.isRemote(fresh.Value.Provider), Result: res, AncestorEnded: anc != "",
		}, func(err error) {
			ownershipKept.CompareAndSwap(false, errors.Is(err, store.ErrOwnershipKept))
			c.log.Warn("epoch end not fully published", "err", err)
		})
		if ownershipKept.Load() {
			// An edge left behind keeps the owner waiting for good: the
			// lease stays taken over, and the next sweep publishes the
			// settled epoch's end again (idempotently) and removes it.
			c.log.Warn("takeover: the ownership edge was not removed; will retry", "session", id, "owner", fresh.Value.Owner)
			return
		}
	}
	if err := c.st.ReleaseLease(ctx, id, taken.Revision); err != nil {
		c.log.Warn("takeover: could not release the lease", "session", id, "err", err)
		return
	}
	c.agents.del(store.LeaseKeyOf(taken.Value))
	c.resumePending(ctx, id)
}

// orphans returns the running records that stayed without a lease for their
// run for at least the host expiry by the observed clock, noting the first
// sighting of the others; hasLease reports whether a run's session holds a
// lease for it.
func (x *runIndex) orphans(hasLease func(protocol.RunRecord) bool, expired func(since time.Duration) bool) []protocol.RunRecord {
	obs := x.clock()
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []protocol.RunRecord
	for _, s := range x.m {
		switch {
		case hasLease(s.rec):
			s.leaseless = 0
		case s.leaseless == 0:
			s.leaseless = obs
		case expired(s.leaseless):
			out = append(out, s.rec)
		}
	}
	return out
}

// orphanDue reports whether a leaseless running record is an orphan: its
// claimer stopped heartbeating (one never seen heartbeating counts as
// dead: the lease-less wait already lasted the host expiry), or, unclaimed,
// its start's budget (RequestBudget) and the host expiry passed since it
// was created.
func (c *Coordinator) orphanDue(rec protocol.RunRecord) bool {
	if rec.HostID == "" {
		return time.Since(time.UnixMilli(rec.CreatedAt)) > c.cfg.RequestBudget+c.cfg.HostExpiry
	}
	_, live, known := c.reg.hostKnown(rec.HostID)
	return !known || !live
}

// settleOrphan settles an orphaned record never started (see the top of
// this file), once the bucket's leader confirms it is still running with no
// lease for it.
//
// The record is read before the lease: its host holds the claim again once
// it holds the lease (store.HoldRun, a compare-and-set at the revision read
// here), so either that lands and this settlement's compare-and-set fails,
// or the lease was already there when it was read.
func (c *Coordinator) settleOrphan(ctx context.Context, seen protocol.RunRecord) {
	run, err := c.st.RunLatest(ctx, seen.RunID)
	if errors.Is(err, store.ErrNotFound) {
		c.runs.forget(seen.RunID) // a spec whose state was never created: no run
		return
	}
	if err != nil || run.Value.State != protocol.RunRunning || run.Value.HostID != seen.HostID {
		return // settled, claimed meanwhile, or unreadable: the next sweep looks again
	}
	rec := run.Value
	if rec.HostID != "" && !c.hostLost(ctx, rec.HostID) {
		return // its claimer heartbeats: it may still take the lease
	}
	// A claimed one-shot run's host takes the session's lease beside its
	// claim and holds the claim no more (internal/worker, startRun): the
	// lease is the fence. The settlement creates it first, taken over by
	// this replica, so that of this create and the claimer's exactly one
	// lands: a claimer whose create is refused starts nothing, and a run
	// whose claimer holds the lease is left to it.
	var taken *store.Record[protocol.AgentRecord]
	if rec.HostID != "" && rec.Mode == protocol.ModeOneShot {
		tomb := protocol.AgentRecord{
			SessionID: rec.ChildID, Kind: protocol.AgentOneShot, HostID: c.cfg.ID, TakenOverBy: c.cfg.ID, Epoch: 2,
			RunID: rec.RunID, Provider: rec.Provider, ParentSession: rec.ParentSession, Notify: rec.Notify, CreatedAt: store.NowMs(),
		}
		trev, err := c.st.CreateLease(ctx, tomb)
		if err != nil {
			// Refused: the claimer (or a takeover) holds the lease. An
			// outcome unknown is decided by the lease sweep: a lease taken
			// over by this replica is taken over again (holderDead).
			return
		}
		c.agents.observe(tomb, trev)
		taken = &store.Record[protocol.AgentRecord]{Value: tomb, Revision: trev}
	} else if l, err := c.st.LeaseLatest(ctx, seen.ChildID); err == nil && l.Value.RunID == seen.RunID {
		return // it has its lease: the lease's holder settles it
	} else if err != nil && !errors.Is(err, store.ErrNotFound) {
		return // the next sweep looks again
	}
	release := func() {
		if taken != nil {
			if err := c.st.ReleaseLease(ctx, rec.ChildID, taken.Revision); err == nil {
				c.agents.del(store.LeaseKeyOf(taken.Value))
			} else {
				c.log.Warn("orphaned run: the lease taken to settle it was not released; the lease sweep takes it over again", "run", rec.RunID, "err", err)
			}
		}
	}
	code, why := protocol.CodeUnavailable, "no instance claimed it and the coordinator that created it stopped before it settled it"
	if rec.HostID != "" {
		code, why = protocol.CodeHostLost, fmt.Sprintf("host %s claimed it and stopped heartbeating before it took the session's lease", rec.HostID)
	}
	rec.State, rec.SettledAt, rec.SettledBy, rec.NotStarted = protocol.RunSettled, store.NowMs(), c.cfg.ID, true
	rec.Result = &protocol.SubagentResult{
		Output: []protocol.ContentBlock{}, StopReason: protocol.StopError, ErrorCode: code,
		Diagnostic: protocol.TruncateDiagnostic("the child was never started: " + why),
	}
	if won, err := c.st.SettleRun(ctx, rec, run.Revision); err != nil || !won {
		if err != nil {
			c.log.Warn("orphaned run: settle; will retry", "run", rec.RunID, "err", err)
		}
		release()
		return
	}
	// The log is touched only once the settlement won: the claimer's hold
	// (store.HoldRun, an epoch's) or its lease (a one-shot run's, held here)
	// then fails, so it writes nothing more. Fenced before, a claimer that
	// had just held its claim lost its log under a live lease (and its run
	// stayed running). A one-shot run's log is fenced (agent/takeover, or
	// an open turn closed) before the lease taken here goes, so a claimer's
	// lease create landing after that (sent before it paused) still finds
	// its first append refused. An epoch's host writes nothing before the
	// hold; a later epoch may hold the session's lease and write the log
	// now, so it is left alone (make test's chaos seed: a resumed epoch's
	// log fenced by the settlement of an earlier epoch orphaned by a killed
	// worker), except a first epoch's descriptor, which the log must get to
	// stay resumable.
	if rec.HostID != "" && (rec.Mode == protocol.ModeOneShot || rec.Descriptor != nil) {
		held := c.noLaterEpoch(rec.ChildID, rec.RunID)
		if taken != nil {
			held = c.holding(*taken)
		}
		if _, err := c.closeInterrupted(ctx, rec.ChildID, protocol.TakeoverData{HostID: rec.HostID, By: c.cfg.ID}, rec.Descriptor, held); err != nil && !errors.Is(err, store.ErrNotFound) {
			c.log.Warn("orphaned run: its log was not closed", "run", rec.RunID, "err", err)
		}
	}
	defer release()
	c.settled(rec)
	c.log.Warn("settled a run left running without a lease", "run", rec.RunID, "session", rec.ChildID, "errorCode", code)
	c.st.PublishRunEnd(rec, c.st.PublishRunNotice, func(err error) { c.log.Warn("orphaned run's notice not published", "run", rec.RunID, "err", err) })
	if rec.Mode == protocol.ModeContinuable {
		c.resumePending(ctx, rec.ChildID)
	}
}
