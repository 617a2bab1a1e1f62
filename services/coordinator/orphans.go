package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Orphaned run records (docs/design.md §7; RELIABILITY.md, I6).
//
// A run or epoch record is settled by the host that holds its session's
// lease, or, when that host dies, by a coordinator taking the lease over. A
// record that is running with no lease for its run has neither: its start
// was cut short between two writes. Two windows leave one behind:
//
//   - an instance claimed the record (claim.go in internal/worker) and died
//     before it took the session's lease: the coordinator that dispatched the
//     start found the record claimed and answered it as started;
//   - the coordinator that created the record died before any instance
//     claimed it and before it could settle it never started.
//
// Every replica watches brood_runs for running records (runindex.Index), and
// its monitor settles those that stayed without a lease for the host expiry,
// once their claimer is dead (or, unclaimed, once the start's budget
// passed): never started, HOST_LOST or UNAVAILABLE, by compare-and-set at
// the revision read from the bucket's leader; the claimer, holding its claim
// again once it holds the lease (store.HoldRun), then starts nothing, and a
// one-shot run's open turn is closed in its log. A one-shot run's caller
// gets its notice; a continuable child's pending messages are resumed
// (settleOrphan, below).

// orphanJobs lists the settlements of orphaned records due now.
func (c *Coordinator) orphanJobs() []job {
	hasLease := func(r protocol.RunRecord) bool {
		l, ok := c.agents.get(r.ChildID, r.Provider) // a run's provider is its child's header's
		return ok && l.rec.RunID == r.RunID
	}
	var jobs []job
	for _, rec := range c.runs.Orphans(hasLease, c.reg.Expired) {
		if !c.orphanDue(rec) {
			continue
		}
		rec := rec
		jobs = append(jobs, job{rec.ChildID, func(ctx context.Context) { c.settleOrphan(ctx, rec) }})
	}
	return jobs
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
	_, live, known := c.reg.HostKnown(rec.HostID)
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
	run, ok := c.orphanConfirmed(ctx, seen)
	if !ok {
		return
	}
	taken, ok := c.fenceOrphan(ctx, run.Value)
	if !ok {
		return
	}
	rec := neverStarted(run.Value, c.cfg.ID)
	if won, err := c.st.SettleRun(ctx, rec, run.Revision); err != nil || !won {
		if err != nil {
			c.log.Warn("orphaned run: settle; will retry", "run", rec.RunID, "err", err)
		}
		c.releaseOrphanLease(ctx, rec, taken)
		return
	}
	c.closeOrphanLog(ctx, rec, taken)
	defer c.releaseOrphanLease(ctx, rec, taken)
	c.settled(rec)
	c.log.Warn("settled a run left running without a lease", "run", rec.RunID, "session", rec.ChildID, "errorCode", rec.Result.ErrorCode)
	c.st.PublishRunEnd(rec, c.st.PublishRunNotice, func(err error) { c.log.Warn("orphaned run's notice not published", "run", rec.RunID, "err", err) })
	if rec.Mode == protocol.ModeContinuable {
		c.resumePending(ctx, rec.ChildID)
	}
}

// orphanConfirmed reads seen's record from the bucket's leader: ok when it
// is still running, claimed by the same host (or none), and that host is
// confirmed lost (hostLost). A record gone is forgotten: a spec whose state
// was never created is no run.
func (c *Coordinator) orphanConfirmed(ctx context.Context, seen protocol.RunRecord) (store.Record[protocol.RunRecord], bool) {
	run, err := c.st.RunLatest(ctx, seen.RunID)
	if errors.Is(err, store.ErrNotFound) {
		c.runs.Forget(seen.RunID)
		return run, false
	}
	if err != nil || run.Value.State != protocol.RunRunning || run.Value.HostID != seen.HostID {
		return run, false // settled, claimed meanwhile, or unreadable: the next sweep looks again
	}
	if run.Value.HostID != "" && !c.hostLost(ctx, run.Value.HostID) {
		return run, false // its claimer heartbeats: it may still take the lease
	}
	return run, true
}

// fenceOrphan makes sure no claimer of rec can still start it: ok false
// leaves rec alone. A claimed one-shot run's host takes the session's lease
// beside its claim and holds the claim no more (internal/worker, startRun):
// the lease is the fence. The settlement creates it first, taken over by
// this replica (returned as taken), so that of this create and the
// claimer's exactly one lands: a claimer whose create is refused starts
// nothing, and a run whose claimer holds the lease is left to it. Any other
// record is left to the holder of a lease for its run, if there is one.
func (c *Coordinator) fenceOrphan(ctx context.Context, rec protocol.RunRecord) (taken *store.Record[protocol.AgentRecord], ok bool) {
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
			return nil, false
		}
		c.agents.observe(tomb, trev)
		return &store.Record[protocol.AgentRecord]{Value: tomb, Revision: trev}, true
	}
	l, err := c.st.LeaseLatest(ctx, rec.ChildID)
	switch {
	case err == nil && l.Value.RunID == rec.RunID:
		return nil, false // it has its lease: the lease's holder settles it
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return nil, false // the next sweep looks again
	}
	return nil, true
}

// neverStarted returns the orphan rec settled by replica `by` as never
// started: UNAVAILABLE when no instance claimed it, HOST_LOST when its
// claimer stopped heartbeating before it took the session's lease.
func neverStarted(rec protocol.RunRecord, by string) protocol.RunRecord {
	code, why := protocol.CodeUnavailable, "no instance claimed it and the coordinator that created it stopped before it settled it"
	if rec.HostID != "" {
		code, why = protocol.CodeHostLost, fmt.Sprintf("host %s claimed it and stopped heartbeating before it took the session's lease", rec.HostID)
	}
	rec.State, rec.SettledAt, rec.SettledBy, rec.NotStarted = protocol.RunSettled, store.NowMs(), by, true
	rec.Result = &protocol.SubagentResult{
		Output: []protocol.ContentBlock{}, StopReason: protocol.StopError, ErrorCode: code,
		Diagnostic: protocol.TruncateDiagnostic("the child was never started: " + why),
	}
	return rec
}

// closeOrphanLog fences the log of the orphan rec, settled: the log is
// touched only once the settlement won, since the claimer's hold
// (store.HoldRun, an epoch's) or its lease (a one-shot run's, held here as
// taken) then fails, so it writes nothing more. Fenced before, a claimer
// that had just held its claim lost its log under a live lease (and its run
// stayed running). A one-shot run's log is fenced (agent/takeover, or an
// open turn closed) before the lease taken here goes, so a claimer's lease
// create landing after that (sent before it paused) still finds its first
// append refused. An epoch's host writes nothing before the hold; a later
// epoch may hold the session's lease and write the log now, so it is left
// alone (make test's chaos seed: a resumed epoch's log fenced by the
// settlement of an earlier epoch orphaned by a killed worker), except a
// first epoch's descriptor, which the log must get to stay resumable.
func (c *Coordinator) closeOrphanLog(ctx context.Context, rec protocol.RunRecord, taken *store.Record[protocol.AgentRecord]) {
	if rec.HostID == "" || (rec.Mode != protocol.ModeOneShot && rec.Descriptor == nil) {
		return
	}
	held := c.noLaterEpoch(rec.ChildID, rec.RunID)
	if taken != nil {
		held = c.holding(*taken)
	}
	if _, err := c.closeInterrupted(ctx, rec.ChildID, protocol.TakeoverData{HostID: rec.HostID, By: c.cfg.ID}, rec.Descriptor, rec.Mode == protocol.ModeContinuable, held); err != nil && !errors.Is(err, store.ErrNotFound) {
		c.log.Warn("orphaned run: its log was not closed", "run", rec.RunID, "err", err)
	}
}

// releaseOrphanLease releases the lease fenceOrphan took for rec (none:
// nothing to do); one not released is taken over again by the lease sweep.
func (c *Coordinator) releaseOrphanLease(ctx context.Context, rec protocol.RunRecord, taken *store.Record[protocol.AgentRecord]) {
	if taken == nil {
		return
	}
	if err := c.st.ReleaseLease(ctx, rec.ChildID, taken.Revision); err == nil {
		c.agents.del(store.LeaseKeyOf(taken.Value))
	} else {
		c.log.Warn("orphaned run: the lease taken to settle it was not released; the lease sweep takes it over again", "run", rec.RunID, "err", err)
	}
}
