package coordinator

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"sync"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Live-children slots (DESIGN.md §4, agent limits; RELIABILITY.md I8). The
// leases in this replica's cache say which children are live, but two
// starts for one parent, on two replicas or on one, both see the same count
// before either child has a lease: a burst would be admitted past
// LiveChildrenMax. So every admission of a new child also takes a slot in
// the parent's slot record, brood_agents `slots.<parent>`, by
// compare-and-set: the admissions of one parent are serialized by the
// record's revision, whichever replica serves them.
//
// A slot is released lazily: the next admission drops every slot whose
// child has no live lease once slotGrace has passed since it was taken (the
// time a start needs to reach its provider and for the child's lease to be
// seen), or at once when this replica saw the child's lease come and go (the
// child ended: a parent delegating many short runs one after another is not
// refused for children long settled), and a start that fails releases its
// slot at once. A child made live again by a cold resume takes a slot too,
// naming the resumed epoch's run, before its epoch record exists; it is never
// refused (an accepted message is never refused), but it counts against the
// parent's next admission whether or not its lease reached this replica's
// cache. A slot past its grace whose child this replica's cache neither
// shows live nor saw end (its watch restarting after a fault) is kept while
// the bucket's leader holds the child's lease: admission rests on the slot
// record and the bucket, never on the cache alone (chaos seeds 1 and 4: the
// limit passed by one).

// slotAttemptsMax bounds the compare-and-set attempts of one admission.
const slotAttemptsMax = 32

// childSlotsRecord and childSlot are the slot record's shape (documented in
// docs/protocol.md §7.6), read and written by store.Slots and WriteSlots.
type (
	childSlotsRecord = protocol.ChildSlotsRecord
	childSlot        = protocol.ChildSlot
)

// slotGrace is how long a slot counts without a live lease behind it: a
// start's whole budget (its attempts at the provider's instances) and two
// host expiries for the child's lease to be seen.
func (c *Coordinator) slotGrace() int64 {
	return (c.cfg.RequestBudget + 2*c.cfg.HostExpiry).Milliseconds()
}

// reserveChild takes a live-children slot of parent for child, or refuses
// with LIMIT_EXCEEDED when the parent's live children (slots still in
// grace, and children with a live lease) already reach the limit. Taking a
// slot the child already holds (a retried start) succeeds. A resumeRun
// (the run id of a cold resume's epoch, "" for an admission) takes the
// child's slot for that run and is never refused. This replica's
// admissions of one parent wait for each other (so they do not race on the
// record), within ctx, and reuse the record they last wrote; only another
// replica's write makes one read it again. Every read and write waits out
// a leader election within ctx (the caller's deadline, less the margin to
// answer): an UNAVAILABLE says how long the admission took, and how much of
// it went to waiting for this replica's other admissions of parent.
func (c *Coordinator) reserveChild(ctx context.Context, parent, child, resumeRun string) error {
	began := time.Now()
	ps := c.slots.of(parent)
	err := ps.lock(ctx)
	waited := time.Since(began)
	unavailable := func(what string, err error) error {
		return protocol.Errorf(protocol.CodeUnavailable, "%s of %s after %s (%s of it waiting for this replica's other admissions of %s): %w",
			what, parent, time.Since(began).Round(time.Millisecond), waited.Round(time.Millisecond), parent, err)
	}
	if err != nil {
		return unavailable("reserve a live-child slot", err)
	}
	defer ps.unlock()
	for attempt := 0; attempt < slotAttemptsMax; attempt++ {
		// A revision this replica remembers may be stale without any
		// contention: a parent's admissions alternate between replicas
		// (the queue group), so each replica's last write is usually
		// behind. Its conflict reads again at once; only a conflict on a
		// revision read just now (another admission of the parent at the
		// same time) waits the backoff.
		cached := ps.known
		if !ps.known {
			cur, err := c.st.Slots(ctx, parent)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return unavailable("read the live children", err)
			}
			ps.rec, ps.rev, ps.known = cur.Value, cur.Revision, true
		}
		now := store.NowMs()
		live := c.liveChildIDs(parent)
		if err := c.confirmLive(ctx, ps.rec.Slots, live, now); err != nil {
			return unavailable("read the live children", err)
		}
		kept, held, count := c.countSlots(ps.rec.Slots, child, live, nil, now)
		if resumeRun != "" {
			kept = append(slices.DeleteFunc(kept, func(s childSlot) bool { return s.ChildID == child }),
				childSlot{ChildID: child, ReservedAt: now, RunID: resumeRun})
			held = true // never refused
		}
		if !held && count >= c.cfg.LiveChildrenMax {
			// This replica's lease cache follows the bucket through a
			// watch, and a run's result reaches its parent before its host
			// deletes the lease: before refusing, the children counted are
			// read fresh, and those that ended are not counted.
			if ended := c.endedChildren(ctx, kept, live); len(ended) > 0 {
				kept, held, count = c.countSlots(ps.rec.Slots, child, live, ended, now)
			}
		}
		if !held {
			if count >= c.cfg.LiveChildrenMax {
				return protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
					"limit": "live children per parent", "reason": fmt.Sprintf("session %s already has %d live children; the limit is %d", parent, count, c.cfg.LiveChildrenMax)})
			}
			kept = append(kept, childSlot{ChildID: child, ReservedAt: now})
		}
		next := childSlotsRecord{Slots: kept}
		rev, err := c.st.WriteSlots(ctx, parent, next, ps.rev)
		if err == nil {
			ps.rec, ps.rev = next, rev
			return nil
		}
		ps.known = false // another replica wrote, or the write's outcome is unknown: read again
		if !errors.Is(err, store.ErrConflict) {
			return unavailable("reserve a live-child slot", err)
		}
		if cached {
			continue
		}
		select {
		case <-ctx.Done():
			return unavailable("reserve a live-child slot", ctx.Err())
		case <-time.After(c.slotBackoff()):
		}
	}
	return protocol.Errorf(protocol.CodeUnavailable, "the live children of %s kept changing; retry", parent)
}

// slotBackoffMax bounds the random wait before a conflicting admission
// tries again, so two replicas' admissions of one parent interleave.
const slotBackoffMax = 20 * time.Millisecond

// randomSlotBackoff is the wait before an admission whose compare-and-set
// met another admission of the same parent tries again: random in
// [0, slotBackoffMax).
func randomSlotBackoff() time.Duration { return time.Duration(rand.Int63n(int64(slotBackoffMax))) }

// parentSlots is what this replica last knew of one parent's slot record.
// Its admissions hold held (a lock a waiter gives up at its deadline: an
// admission stalled by an election must not make the ones behind it answer
// after their callers stopped waiting) while they use it.
type parentSlots struct {
	held  chan struct{} // capacity 1: full while an admission holds it
	rec   childSlotsRecord
	rev   uint64
	known bool
}

// lock takes ps for an admission, or returns ctx's error once ctx is done.
func (ps *parentSlots) lock(ctx context.Context) error {
	select {
	case ps.held <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (ps *parentSlots) unlock() { <-ps.held }

// slotCache holds parentSlots by parent, at most slotParentsCachedMax.
type slotCache struct {
	mu sync.Mutex
	m  map[string]*parentSlots
}

// slotParentsCachedMax bounds the parents whose slot record a replica keeps.
const slotParentsCachedMax = 10000

func (sc *slotCache) of(parent string) *parentSlots {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.m == nil || len(sc.m) >= slotParentsCachedMax {
		sc.m = map[string]*parentSlots{} // dropping an entry only costs a read
	}
	ps := sc.m[parent]
	if ps == nil {
		ps = &parentSlots{held: make(chan struct{}, 1)}
		sc.m[parent] = ps
	}
	return ps
}

// releaseChild gives back child's slot after its start failed, within
// what is left of ctx, then, when that did not do, in the background
// within store.SettleBudget (an election outlasting the start's budget);
// a slot left behind still lapses after slotGrace. It does not wait for
// this replica's admissions of parent, nor they for it: it reads the record
// from the bucket's leader and writes it by compare-and-set, and an
// admission whose remembered revision it superseded reads it again.
func (c *Coordinator) releaseChild(ctx context.Context, parent, child string) {
	if c.dropSlot(ctx, parent, child) == nil {
		return
	}
	c.background(func(bg context.Context) {
		ctx, cancel := context.WithTimeout(bg, store.SettleBudget)
		defer cancel()
		if err := c.dropSlot(ctx, parent, child); err != nil {
			c.log.Warn("a failed start's live-child slot not released; it lapses after its grace", "parent", parent, "child", child, "grace", time.Duration(c.slotGrace())*time.Millisecond, "err", err)
		}
	})
}

// dropSlot removes child's slot from parent's slot record (read from the
// leader, written by compare-and-set); a record without it is no error.
func (c *Coordinator) dropSlot(ctx context.Context, parent, child string) error {
	for attempt := 0; attempt < slotAttemptsMax; attempt++ {
		cur, err := c.st.Slots(ctx, parent)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		kept := slices.DeleteFunc(slices.Clone(cur.Value.Slots), func(s childSlot) bool { return s.ChildID == child })
		if len(kept) == len(cur.Value.Slots) {
			return nil
		}
		if _, err = c.st.WriteSlots(ctx, parent, childSlotsRecord{Slots: kept}, cur.Revision); !errors.Is(err, store.ErrConflict) {
			return err
		}
	}
	return fmt.Errorf("the live children of %s kept changing", parent)
}

// countSlots returns the slots of slots to keep (child's own renewed at now),
// whether child held one already, and how many live children they and live
// (children with a live lease, slot or not) count. A slot is kept while its
// child is live, or within slotGrace of its reservation unless it is
// known to have ended (this replica saw the lease of its child, or of its
// resumed run, come and go, or ended names its child); a child in ended is
// not live.
func (c *Coordinator) countSlots(slots []childSlot, child string, live, ended map[string]bool, now int64) (kept []childSlot, held bool, count int) {
	isLive := func(id string) bool { return live[id] && !ended[id] }
	for _, s := range slots {
		switch {
		case s.ChildID == child:
			held = true
			kept = append(kept, childSlot{ChildID: child, ReservedAt: now, RunID: s.RunID})
		case isLive(s.ChildID) || (now-s.ReservedAt < c.slotGrace() && !c.slotEnded(s) && !ended[s.ChildID]):
			kept = append(kept, s)
		}
	}
	count = len(kept)
	for id := range live {
		if isLive(id) && !hasSlot(kept, id) {
			count++
		}
	}
	return kept, held, count
}

// slotEnded reports whether this replica saw the lease of a slot's child
// (of its resumed run, for a cold resume's slot) come and go.
func (c *Coordinator) slotEnded(s childSlot) bool {
	if s.RunID != "" {
		return c.agents.hasEndedRun(s.RunID)
	}
	return c.agents.hasEnded(s.ChildID)
}

// confirmLive adds to live the children of slots past their grace that this
// replica's cache neither shows live nor saw end, whose lease the bucket's
// leader still holds: a cache that lost a lease (its watch restarting after
// a fault) does not free a live child's slot.
func (c *Coordinator) confirmLive(ctx context.Context, slots []childSlot, live map[string]bool, now int64) error {
	for _, s := range slots {
		if live[s.ChildID] || now-s.ReservedAt < c.slotGrace() || c.slotEnded(s) {
			continue
		}
		lease, err := c.st.LeaseLatest(ctx, s.ChildID)
		switch {
		case err == nil:
			if s.RunID == "" || lease.Value.RunID == s.RunID {
				live[s.ChildID] = true
			}
		case !errors.Is(err, store.ErrNotFound):
			return err
		}
	}
	return nil
}

// endedChildren reads fresh, for each child of slots and live, whether it
// ended: its lease is there but its run (or epoch) is settled (a host
// publishes the result before it releases the lease), or its lease is gone
// although this replica saw it live (its watch lags), or, with no lease and
// no slot seen live, the run record named by its id (a local one-shot run's
// id is its child's) is settled. A read that fails counts the child as live:
// a refusal is retried, a limit passed is not undone.
func (c *Coordinator) endedChildren(ctx context.Context, slots []childSlot, live map[string]bool) map[string]bool {
	ids := map[string]bool{}
	for _, s := range slots {
		ids[s.ChildID] = true
	}
	for id := range live {
		ids[id] = true
	}
	settled := func(runID string) bool {
		run, err := c.st.Run(ctx, runID)
		return err == nil && run.Value.State == protocol.RunSettled
	}
	ended := map[string]bool{}
	for _, s := range slots {
		if s.RunID != "" && settled(s.RunID) {
			ended[s.ChildID] = true
		}
	}
	for id := range ids {
		if ended[id] {
			continue
		}
		// From the bucket's leader: a follower's direct get may not have a
		// lease created a moment ago (the watch that showed it live reads
		// the leader's stream), or may still show the lease of an epoch
		// that ended; either would free the slot of a live child (chaos
		// seed 4: a burst of starts admitted one child past the limit).
		lease, err := c.st.LeaseLatest(ctx, id)
		switch {
		case err == nil:
			if lease.Value.RunID != "" && settled(lease.Value.RunID) {
				ended[id] = true
			}
		case !errors.Is(err, store.ErrNotFound):
		case live[id]:
			ended[id] = true
		case settled(id):
			ended[id] = true
		}
	}
	return ended
}

// liveChildIDs are the children of parent with a live agent now.
func (c *Coordinator) liveChildIDs(parent string) map[string]bool {
	out := map[string]bool{}
	for _, l := range c.agents.childrenOf(parent) {
		if l.rec.Kind != protocol.AgentRoot && c.leaseLive(l.rec) {
			out[l.rec.SessionID] = true
		}
	}
	return out
}

func hasSlot(slots []childSlot, id string) bool {
	for _, s := range slots {
		if s.ChildID == id {
			return true
		}
	}
	return false
}
