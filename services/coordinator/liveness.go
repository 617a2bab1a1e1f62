package coordinator

// Liveness: what happens when a host dies (docs/design.md §4, Liveness; §7,
// Settlement 2; RELIABILITY.md, I6), read top to bottom:
//
//  1. Death is judged on evidence about the host only. The host registry
//     (hostreg.Registry) runs an observed clock on this replica's own heartbeats
//     coming back through the brood_hosts watch; a host silent for more
//     than the host expiry of that clock is dead, and a lease's holder is
//     dead when its host is (holderDead, below).
//  2. Every quarter of the expiry the monitor (below) sweeps the cached
//     leases and run records into jobs (sweep), one per session at a time
//     in this replica (claim), each a compare-and-set, so replicas racing
//     on a session are safe:
//     - a lease whose holder is dead: takeOver (takeover.go) takes the
//     lease over, closes the open turn as interrupted with a fenced
//     append, settles the run HOST_LOST (a continuable child's epoch
//     ends, its pending messages are resumed: resume.go) and publishes
//     its end;
//     - a run record left running with no lease for the host expiry (its
//     claimer died before it took the lease, or its coordinator before
//     any claim): settleOrphan (orphans.go) settles it never started;
//     - a root whose lease lapsed: expireRoot; a one-shot run whose parent
//     is gone: disposeOrphan (below); settled runs' records past their
//     lifetime: expiry.go.
//  3. Before it acts on a death, a job confirms it on the host's record
//     read fresh from the bucket's leader (hostLost, below): a heartbeat
//     the watch did not deliver makes the host live again, and nothing is
//     done.

import (
	"context"
	"errors"
	"time"

	"github.com/brood-dev/brood/internal/gopool"
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
// come back through them (hostreg.Registry.Stalled): the caches were silent.
func (c *Coordinator) monitor(ctx context.Context) {
	interval := min(c.cfg.HeartbeatInterval, c.cfg.HostExpiry/4)
	t := time.NewTicker(interval)
	defer t.Stop()
	// The jobs run on reused goroutines: a fresh one per job grew its stack
	// again each time (3-19 µs of CPU per one-shot run in the throughput
	// loop: a settled run's spec gets its lifetime in a job, expiry.go).
	jobs := gopool.New(ctx)
	defer jobs.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if c.reg.Stalled() {
			c.log.Warn("own heartbeat did not come back through the hosts watch; opening the KV watches again")
			c.hostsWatch.Restart()
			c.agentsWatch.Restart()
			c.runsWatch.Restart()
		}
		for _, job := range c.sweep() {
			jobs.Go(func() {
				if !c.claim(job.id) {
					return
				}
				defer c.release(job.id)
				job.run(ctx)
			})
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
	jobs = append(jobs, c.expiryJobs()...)
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
	_, live, known := c.reg.HostKnown(l.rec.HostID)
	if known {
		return !live
	}
	return c.reg.Expired(l.firstObs)
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
// live again from now (hostreg.Registry.Confirm), and nothing is done; no record at
// the leader confirms the loss; a read that failed (the bucket electing)
// decides nothing now. A host is declared lost only on a record read fresh
// (issue 16: a run settled HOST_LOST 0.2 s after its coordinator opened its
// watches again, while its host heartbeated).
func (c *Coordinator) hostLost(ctx context.Context, id string) bool {
	rctx, cancel := context.WithTimeout(ctx, hostLostWait)
	defer cancel()
	rec, err := c.st.HostLatest(rctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return true
	case err != nil:
		c.log.Info("a host judged lost could not be read from the leader; deciding at the next sweep", "host", id, "err", err)
		return false
	}
	if c.reg.Confirm(store.HostKey(id), rec.Value, rec.Revision) {
		c.log.Warn("a host judged lost heartbeated after the record this replica had; keeping it live", "host", id)
		return false
	}
	return true
}

// expireRoot ends a root whose lease lapsed: its credential dies with the
// lease, and its one-shot runs are disposed (docs/design.md §7, Settlement 4).
func (c *Coordinator) expireRoot(ctx context.Context, l leaseState) {
	if err := c.markClosed(ctx, l.rec.SessionID); err != nil {
		c.log.Warn("could not expire root", "session", l.rec.SessionID, "err", err)
		return
	}
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
