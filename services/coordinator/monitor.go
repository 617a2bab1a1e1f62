package coordinator

import (
	"context"
	"errors"
	"sync"
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
// come back through them (registry.stalled): the caches were silent.
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
		if c.reg.stalled() {
			c.log.Warn("own heartbeat did not come back through the hosts watch; opening the KV watches again")
			c.hostsWatch.restart()
			c.agentsWatch.restart()
			c.runsWatch.restart()
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

// LivenessResumesMax bounds the cold resumes the liveness sweep runs at
// once; sessions beyond it wait for the next sweep.
const LivenessResumesMax = 16

// notResumableRecheck is how long the liveness sweep skips a session it
// found can never be resumed, unless its inbox changes first.
const notResumableRecheck = time.Minute

// liveness resumes continuable children that have accepted items in their
// inbox but no live activation (docs/design.md §4, Liveness; RELIABILITY.md, L1):
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
		pending, err := c.st.PendingInboxes(ctx)
		if err != nil {
			continue
		}
		now := time.Now()
		for subject, n := range pending {
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
	h, err := c.headers.get(ctx, c.st, id)
	if err != nil {
		return !errors.Is(err, store.ErrNotFound)
	}
	items, err := c.st.InboxOf(h.Scope(), id).Pending(ctx, 0)
	if err != nil || len(items) == 0 {
		return true
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
// its live continuable children, docs/design.md §7), else "". An epoch resumed
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
