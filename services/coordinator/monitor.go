package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TakeoverAttemptsMax bounds the fenced appends of one takeover that race
// with a host that came back.
const TakeoverAttemptsMax = 3

// monitor judges liveness from the cached leases and host records, every
// quarter of the host expiry: it settles the runs of dead hosts (HOST_LOST),
// expires lapsed roots and disposes one-shot runs whose parent is gone.
// Every action is a CAS, so replicas racing on the same session are safe. It
// also opens the KV watches again when this replica's own heartbeat does not
// come back through them (registry.stalled): the caches were silent.
func (c *Coordinator) monitor(ctx context.Context) {
	interval := min(c.cfg.HeartbeatInterval, c.cfg.HostExpiry/4)
	t := time.NewTicker(interval)
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if c.reg.stalled() {
			c.log.Warn("own heartbeat did not come back through the hosts watch; opening the KV watches again")
			c.hostsWatch.restart()
			c.agentsWatch.restart()
			c.runsWatch.restart()
		}
		for _, job := range c.sweep() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if !c.claim(job.id) {
					return
				}
				defer c.release(job.id)
				job.run(ctx)
			}()
		}
	}
}

type job struct {
	id  string
	run func(ctx context.Context)
}

func (c *Coordinator) sweep() []job {
	now := time.Now()
	nowMs := now.UnixMilli()
	leases := c.agents.snapshot()
	live := make(map[string]bool, len(leases))
	for _, l := range leases {
		live[l.rec.SessionID] = true
	}
	var jobs []job
	// A drain below a root lasts while that exact root agent lives.
	for scope, m := range c.agents.drainMarks() {
		if scope == store.DrainAll {
			continue
		}
		hctx, cancel := context.WithTimeout(context.Background(), markHeaderWait)
		l, ok := c.leaseCached(hctx, scope)
		cancel()
		if !ok || l.rec.CredentialHash != m.CredentialHash {
			jobs = append(jobs, job{store.DrainKey(scope), func(ctx context.Context) { _ = c.st.DeleteDrain(ctx, scope) }})
		}
	}
	jobs = append(jobs, c.orphanJobs()...)
	for _, l := range leases {
		l := l
		switch {
		case l.rec.Kind == protocol.AgentRoot:
			if l.rec.ExpiresAt < nowMs {
				jobs = append(jobs, job{l.rec.SessionID, func(ctx context.Context) { c.expireRoot(ctx, l) }})
			}
		case c.holderDead(l):
			jobs = append(jobs, job{l.rec.SessionID, func(ctx context.Context) { c.takeOver(ctx, l) }})
		case l.rec.Kind == protocol.AgentOneShot && l.rec.ParentSession != "" && !live[l.rec.ParentSession] &&
			now.Sub(l.firstSeen) > c.cfg.HostExpiry:
			jobs = append(jobs, job{l.rec.SessionID, func(ctx context.Context) { c.disposeOrphan(ctx, l) }})
		}
	}
	return jobs
}

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

// expireRoot ends a root whose lease lapsed: its credential dies with the
// lease, and its one-shot runs are disposed (DESIGN.md §7, Settlement 4).
func (c *Coordinator) expireRoot(ctx context.Context, l leaseState) {
	err := c.st.ReleaseLease(ctx, l.rec.SessionID, l.rev)
	if err != nil && !errors.Is(err, store.ErrConflict) {
		c.log.Warn("could not expire root", "session", l.rec.SessionID, "err", err)
		return
	}
	if err == nil {
		c.log.Info("root lease lapsed", "session", l.rec.SessionID)
		c.agents.del(store.RootLeaseKey(l.rec.SessionID))
		c.disposeOrphans(ctx, l.rec.SessionID)
	}
}

// disposeOrphans disposes the one-shot runs of a parent that stopped being live.
func (c *Coordinator) disposeOrphans(ctx context.Context, parent string) {
	for _, l := range c.agents.snapshot() {
		if l.rec.Kind == protocol.AgentOneShot && l.rec.ParentSession == parent {
			if c.claim(l.rec.SessionID) {
				c.disposeOrphan(ctx, l)
				c.release(l.rec.SessionID)
			}
		}
	}
}

func (c *Coordinator) disposeOrphan(ctx context.Context, l leaseState) {
	// From the bucket's leader: a replica not yet current may lack a run
	// created a moment ago, and its lease would go while the run works on
	// (chaos seed 1 of make test: a root closed just after it started a run).
	run, err := c.st.RunLatest(ctx, l.rec.RunID)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			_ = c.st.ReleaseLease(ctx, l.rec.SessionID, l.rev)
		}
		return
	}
	if run.Value.State == protocol.RunSettled {
		return
	}
	c.log.Info("disposing a one-shot run whose parent is gone", "run", l.rec.RunID, "parent", l.rec.ParentSession)
	if _, err := c.disposeRun(ctx, run.Value, protocol.CauseParent); err != nil {
		c.log.Warn("orphan dispose failed", "run", l.rec.RunID, "err", err)
	}
}

// takeOver settles the run of a session whose host died (DESIGN.md §7,
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
		<-c.st.PublishRunEnd(run.Value, onErr)
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
	events, err := c.closeInterrupted(ctx, id, protocol.TakeoverData{HostID: deadHost, By: c.cfg.ID, Epoch: taken.Value.Epoch}, nil)
	if err != nil {
		c.log.Warn("takeover: could not close the open turn; will retry", "session", id, "err", err)
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
	if end, ok := sessionlog.LastTurnEnd(own); ok && end.Reason.Kind == protocol.TurnInterrupted {
		res.StopReason = protocol.StopError
		res.ErrorCode = protocol.CodeHostLost
		res.Diagnostic = fmt.Sprintf("host %s stopped heartbeating for more than %s; the coordinator closed the open turn as interrupted", deadHost, c.cfg.HostExpiry)
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
			<-c.st.PublishRunEnd(r.Value, onErr)
		}
	case err != nil:
		// Not settled: the lease stays taken over, so the next sweep tries
		// again.
		c.log.Warn("takeover: settle; will retry", "run", rec.RunID, "err", err)
		return
	default:
		c.settled(rec)
		<-c.st.PublishStartAgain(rec, onErr)
		<-c.st.PublishRunEnd(rec, onErr)
		c.log.Info("run settled after host loss", "run", rec.RunID, "stopReason", res.StopReason, "errorCode", res.ErrorCode)
	}
	if err := c.st.ReleaseLease(ctx, id, taken.Revision); err == nil {
		c.agents.del(id)
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
func (c *Coordinator) closeInterrupted(ctx context.Context, id string, fence protocol.TakeoverData, desc *protocol.DescriptorData) ([]protocol.SessionEvent, error) {
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

// isTakeover reports whether ev is the agent/takeover of fence's coordinator and epoch.
func isTakeover(ev protocol.SessionEvent, fence protocol.TakeoverData) bool {
	var d protocol.TakeoverData
	return ev.Type == protocol.EvAgentTakeover && ev.Decode(&d) == nil && d.By == fence.By && d.Epoch == fence.Epoch
}

// takeOverActivation ends the epoch of a continuable child whose host died.
// The child is not failed: its turn in flight is closed as interrupted, the
// epoch settles (aborted, HOST_LOST), the parent gets its notice and the
// ownership edge is released, and accepted items still in the inbox are
// resumed on a live host (DESIGN.md §7, Settlement 2; §4, Liveness).
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
	events, err := c.closeInterrupted(ctx, id, protocol.TakeoverData{HostID: deadHost, By: c.cfg.ID, Epoch: taken.Value.Epoch}, run.Value.Descriptor)
	if err != nil {
		c.log.Warn("takeover: could not close the open turn; will retry", "session", id, "err", err)
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
		<-c.st.EndEpoch(ctx, store.EpochEnd{
			ChildID: id, Parent: fresh.Value.ParentSession, Owner: fresh.Value.Owner, RunID: fresh.Value.RunID,
			Provider: fresh.Value.Provider, Remote: c.isRemote(fresh.Value.Provider), Result: res, AncestorEnded: anc != "",
		}, func(err error) { c.log.Warn("epoch end not fully published", "err", err) })
	}
	if err := c.st.ReleaseLease(ctx, id, taken.Revision); err != nil {
		c.log.Warn("takeover: could not release the lease", "session", id, "err", err)
		return
	}
	c.agents.del(id)
	c.resumePending(ctx, id)
}

// LivenessResumesMax bounds the cold resumes the liveness sweep runs at
// once; sessions beyond it wait for the next sweep.
const LivenessResumesMax = 16

// notResumableRecheck is how long the liveness sweep skips a session it
// found can never be resumed, unless its inbox changes first.
const notResumableRecheck = time.Minute

// liveness resumes continuable children that have accepted items in their
// inbox but no live activation (DESIGN.md §4, Liveness; RELIABILITY.md, L1):
// an accepted message never waits for another followup to be noticed. Each
// sweep (every LivenessInterval, and at once when a drain is lifted) starts
// the resumes it finds in parallel, each bounded by resumeTimeout, so one
// slow or failing resume (a provider that does not answer) delays no other
// session, and a resume that failed or was cut off is tried again at the
// next sweep. Only a session that can never be resumed (a root's inbox, a
// one-shot child, an ACP session without session/load) is skipped, until
// its inbox changes or notResumableRecheck passed.
func (c *Coordinator) liveness(ctx context.Context) {
	t := time.NewTicker(c.cfg.LivenessInterval)
	defer t.Stop()
	type never struct {
		pending uint64 // the inbox's item count when it was found not resumable
		until   time.Time
	}
	var mu sync.Mutex
	skip := map[string]never{}
	slots := make(chan struct{}, LivenessResumesMax)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.kick: // a drain was lifted: held messages run now
			mu.Lock()
			clear(skip)
			mu.Unlock()
		}
		info, err := c.st.Inbox.Info(ctx, jetstream.WithSubjectFilter(c.subj.Inbox("*")))
		if err != nil {
			continue
		}
		now := time.Now()
		for subject, n := range info.State.Subjects {
			id := protocol.SessionIDFromSubject(subject)
			mu.Lock()
			sk, skipped := skip[id]
			mu.Unlock()
			if n == 0 || (skipped && sk.pending == n && now.Before(sk.until)) {
				continue
			}
			if l, ok := c.leaseCached(ctx, id); ok && c.leaseLive(l.rec) {
				continue // resident: the activation claims its own inbox
			}
			if !c.claim("resume." + id) {
				continue // a resume of it is in flight
			}
			select {
			case slots <- struct{}{}:
			default:
				c.release("resume." + id) // every slot is busy: the next sweep
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				defer c.release("resume." + id)
				rctx, cancel := context.WithTimeout(ctx, c.resumeTimeout())
				defer cancel()
				resumable := c.resume(rctx, id)
				mu.Lock()
				if resumable {
					delete(skip, id)
				} else {
					skip[id] = never{pending: n, until: now.Add(notResumableRecheck)}
				}
				mu.Unlock()
			}()
		}
	}
}

// resumeTimeout bounds one cold resume: the reads it needs and the
// attempts at the provider's instances to activate it (a request's budget).
func (c *Coordinator) resumeTimeout() time.Duration {
	return c.cfg.RequestBudget + 10*time.Second
}

// resumePending cold-resumes a child with pending inbox items and no live
// activation (unless a resume of it is in flight). It reports false when
// the session will never be resumed (not a continuable child), so callers
// stop asking.
func (c *Coordinator) resumePending(ctx context.Context, id string) bool {
	if !c.claim("resume." + id) {
		return true
	}
	defer c.release("resume." + id)
	return c.resume(ctx, id)
}

// resume is resumePending for a caller that claimed "resume."+id.
func (c *Coordinator) resume(ctx context.Context, id string) bool {
	items, err := c.st.InboxOf(id).Pending(ctx, 0)
	if err != nil || len(items) == 0 {
		return true
	}
	h, err := c.headers.get(ctx, c.st, id)
	if err != nil {
		return !errors.Is(err, store.ErrNotFound)
	}
	if h.ParentSession == "" || h.Origin != protocol.OriginSubagent {
		return false // a root's inbox is its client's to read
	}
	up, err := c.lineage(ctx, h)
	if err != nil || c.drainingFor(append(up, id)) != "" {
		return true
	}
	lease, err := c.resident(ctx, id)
	if err != nil || lease != nil {
		return true
	}
	d, err := c.resumable(ctx, h)
	if err != nil {
		return !errors.Is(err, protocol.ErrNotResumable)
	}
	if err := c.coldResume(ctx, h, d, c.ownerOf(ctx, h)); err != nil {
		c.log.Warn("liveness: cold resume failed; the next sweep tries again", "session", id, "err", err)
	}
	return true
}

// ownerOf returns the continuable parent that owns a resumed child: its
// parent while that is a live continuable agent (a continuable parent owns
// its live continuable children, DESIGN.md §7), else "". An epoch resumed
// without its owner would never release the edge its parent's followup
// registered, and the parent would wait for it forever.
func (c *Coordinator) ownerOf(ctx context.Context, h protocol.SessionHeader) string {
	l, err := c.st.LeaseLatest(ctx, h.ParentSession)
	if err != nil || l.Value.Kind != protocol.AgentContinuable || !c.leaseLive(l.Value) {
		return ""
	}
	return h.ParentSession
}

func (c *Coordinator) isRemote(provider string) bool {
	d, _ := c.reg.provider(provider)
	return d.Remote
}
