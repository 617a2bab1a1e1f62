package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Orphaned run records (DESIGN.md §7; RELIABILITY.md, I6).
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
// Every replica watches brood_runs for running records, and its monitor
// settles those that stayed without a lease for the host expiry, once their
// claimer is dead (or, unclaimed, once the start's budget passed): never
// started, HOST_LOST or UNAVAILABLE, by compare-and-set at the revision read
// from the bucket's leader; the claimer, holding its claim again once it
// holds the lease (store.HoldRun), then starts nothing, and a one-shot run's
// open turn is closed in its log. A one-shot run's caller gets its notice; a
// continuable child's pending messages are resumed.

// runIndex caches the running run and epoch records of brood_runs.
type runIndex struct {
	clock func() time.Duration // the registry's observed clock
	mu    sync.Mutex
	m     map[string]*runState
}

type runState struct {
	rec protocol.RunRecord
	// leaseless is the observed time at which a sweep first found no lease
	// for the run (0: it had one, or no sweep looked yet).
	leaseless time.Duration
}

func newRunIndex(clock func() time.Duration) *runIndex {
	return &runIndex{clock: clock, m: map[string]*runState{}}
}

func (x *runIndex) put(key string, e jetstream.KeyValueEntry) {
	rec, err := store.Decode[protocol.RunRecord](e)
	x.mu.Lock()
	defer x.mu.Unlock()
	if err != nil || rec.State != protocol.RunRunning {
		delete(x.m, key)
		return
	}
	if s, ok := x.m[key]; ok {
		s.rec = rec
		return
	}
	x.m[key] = &runState{rec: rec}
}

func (x *runIndex) del(key string) {
	x.mu.Lock()
	delete(x.m, key)
	x.mu.Unlock()
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

// orphanJobs lists the settlements of orphaned records due now.
func (c *Coordinator) orphanJobs() []job {
	hasLease := func(r protocol.RunRecord) bool {
		l, ok := c.agents.get(r.ChildID, false)
		return ok && l.rec.RunID == r.RunID
	}
	var jobs []job
	for _, rec := range c.runs.orphans(hasLease, c.reg.expired) {
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
	if err != nil || run.Value.State != protocol.RunRunning || run.Value.HostID != seen.HostID {
		return // settled, claimed meanwhile, or unreadable: the next sweep looks again
	}
	if l, err := c.st.LeaseLatest(ctx, seen.ChildID); err == nil && l.Value.RunID == seen.RunID {
		return // it has its lease: the lease's holder settles it
	} else if err != nil && !errors.Is(err, store.ErrNotFound) {
		return // the next sweep looks again
	}
	rec := run.Value
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
		return
	}
	// The log is touched only once the settlement won: the claimer's hold
	// (store.HoldRun) then fails, so it writes nothing more. Fenced before,
	// a claimer that had just held its claim lost its log under a live
	// lease (and its run stayed running). A one-shot run's host writes its
	// first records beside its lease, before the hold: its open turn is
	// closed. An epoch's host writes nothing before the hold; a later epoch
	// may hold the session's lease and write the log now, so it is left
	// alone (make test's chaos seed: a resumed epoch's log fenced by the
	// settlement of an earlier epoch orphaned by a killed worker), except a
	// first epoch's descriptor, which the log must get to stay resumable.
	if rec.HostID != "" && (rec.Mode == protocol.ModeOneShot || rec.Descriptor != nil) {
		if _, err := c.closeInterrupted(ctx, rec.ChildID, protocol.TakeoverData{HostID: rec.HostID, By: c.cfg.ID}, rec.Descriptor); err != nil && !errors.Is(err, store.ErrNotFound) {
			c.log.Warn("orphaned run: its log was not closed", "run", rec.RunID, "err", err)
		}
	}
	c.settled(rec)
	c.log.Warn("settled a run left running without a lease", "run", rec.RunID, "session", rec.ChildID, "errorCode", code)
	c.st.PublishRunEnd(rec, func(err error) { c.log.Warn("orphaned run's notice not published", "run", rec.RunID, "err", err) })
	if rec.Mode == protocol.ModeContinuable {
		c.resumePending(ctx, rec.ChildID)
	}
}
