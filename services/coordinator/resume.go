package coordinator

// Resumes (docs/design.md §4, Liveness; RELIABILITY.md, L1): a continuable
// child with accepted messages in its inbox and no live activation is
// resumed on a live host, by the liveness sweep or right after the event
// that left its messages waiting (a takeover, an orphan settled, a drain
// lifted).

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

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

// resume is resumePending for a caller that claimed "resume."+id. A child
// has work when its inbox holds items its log has not claimed, or when its
// log ends in a turn parked on a request (sessionlog.Parked: its host died
// while a call waited for an answer; docs/protocol.md §5.21, "After a
// restart"), which its next activation continues.
func (c *Coordinator) resume(ctx context.Context, id string) bool {
	h, err := c.headers.get(ctx, c.st, id)
	if err != nil {
		return !errors.Is(err, store.ErrNotFound)
	}
	items, err := c.st.InboxOf(h.Scope(), id).Pending(ctx, 0)
	if err != nil {
		return true
	}
	queued := len(items) > 0
	if h.ParentSession == "" || h.Origin != protocol.OriginSubagent {
		return !queued // a root's inbox is its client's to read
	}
	// Work the log claimed is done, though still in the inbox (wakes.go):
	// skipped like a session never resumable until its inbox changes.
	if queued {
		if items, err = c.pendingWork(ctx, h, items); err != nil {
			return true
		}
	}
	if len(items) == 0 {
		parked, err := c.parkedTurn(ctx, h)
		if err != nil {
			return true
		}
		if !parked {
			return !queued
		}
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
	owner, err := c.wakeOwner(ctx, h, nil)
	if err == nil {
		err = c.coldResume(ctx, h, d, owner)
	}
	if err != nil {
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
	d, _ := c.reg.Provider(provider)
	return d.Remote
}

// parkedTurn reports whether child h's log ends in a turn parked on a
// request (sessionlog.Parked), which only its next activation continues.
func (c *Coordinator) parkedTurn(ctx context.Context, h protocol.SessionHeader) (bool, error) {
	log, err := c.st.ReadLog(ctx, h.Scope(), h.ID)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, parked := sessionlog.Parked(log.Events)
	return parked, nil
}

// wakeParked resumes, in the background, the child whose request was just
// answered when no live activation holds it (its host died while the call
// waited, and no resume has run since): its next activation continues the
// parked turn and reads the answer (resume). A resident child reads the
// answer itself; a resume that fails or finds nothing parked changes
// nothing (the request's answer stays in its record for the activation
// that eventually continues the turn). Two wakes, or a wake and a resume
// already under way, activate the child once: the epoch's lease is taken
// by compare-and-set.
func (c *Coordinator) wakeParked(ctx context.Context, child string) {
	if c.residentCached(ctx, child) != nil {
		return
	}
	span := trace.SpanFromContext(ctx)
	c.background(func(bg context.Context) {
		rctx, cancel := context.WithTimeout(trace.ContextWithSpan(bg, span), coldResumeBudget)
		defer cancel()
		c.resumePending(rctx, child)
	})
}
