package coordinator

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator/slotrecord"
)

// Live-children slots (docs/design.md §4, agent limits; RELIABILITY.md I8). The
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
// child's slot for that run and is never refused. The record is taken as
// every slot record is (slotrecord.Records.Reserve: this replica's admissions of
// parent wait for each other within ctx, reads from the leader, the
// compare-and-set's retries, an UNAVAILABLE that says how long it took).
func (c *Coordinator) reserveChild(ctx context.Context, parent, child, resumeRun string) error {
	return c.reserveSlot(ctx, parent, child, resumeRun, true)
}

// reserveSlot is reserveChild; fresh false refuses at the limit without
// reading the counted children from the leader first (endedChildren): a
// queued start's admission (startqueue.go), which the end of a counted
// child kicks again once this replica's cache saw it.
func (c *Coordinator) reserveSlot(ctx context.Context, parent, child, resumeRun string, fresh bool) error {
	return c.childSlots.Reserve(ctx, parent, func(ctx context.Context, rec childSlotsRecord, now int64) (childSlotsRecord, error) {
		live := c.liveChildIDs(parent)
		if err := c.confirmLive(ctx, rec.Slots, live, now); err != nil {
			return rec, err
		}
		kept, held, count := c.countSlots(rec.Slots, child, live, nil, now)
		if resumeRun != "" {
			kept = append(slices.DeleteFunc(kept, func(s childSlot) bool { return s.ChildID == child }),
				childSlot{ChildID: child, ReservedAt: now, RunID: resumeRun})
			held = true // never refused
		}
		if !held && count >= c.cfg.LiveChildrenMax && fresh {
			// This replica's lease cache follows the bucket through a
			// watch, and a run's result reaches its parent before its host
			// deletes the lease: before refusing, the children counted are
			// read fresh, and those that ended are not counted.
			if ended := c.endedChildren(ctx, kept, live); len(ended) > 0 {
				kept, held, count = c.countSlots(rec.Slots, child, live, ended, now)
			}
		}
		if !held {
			if count >= c.cfg.LiveChildrenMax {
				return rec, protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
					"limit": "live children per parent", "reason": fmt.Sprintf("session %s already has %d live children; the limit is %d", parent, count, c.cfg.LiveChildrenMax)})
			}
			kept = append(kept, childSlot{ChildID: child, ReservedAt: now})
		}
		return childSlotsRecord{Slots: kept}, nil
	})
}

// newChildSlots is the live-children slot records, brood_agents
// `slots.<parent>` (store.Slots, store.WriteSlots).
func (c *Coordinator) newChildSlots() *slotrecord.Records[childSlotsRecord] {
	return &slotrecord.Records[childSlotsRecord]{
		Read: c.st.Slots, Write: c.st.WriteSlots,
		Slot: "live-child slot", Records: "live children", Admissions: "admissions",
		Of:      func(parent string) string { return parent },
		Backoff: func() time.Duration { return c.slotBackoff() }, Background: c.background,
		Grace: func() time.Duration { return time.Duration(c.slotGrace()) * time.Millisecond }, Log: c.log,
	}
}

// randomSlotBackoff is the wait before an admission whose compare-and-set
// met another admission of the same owner tries again: random in
// [0, slotrecord.BackoffMax).
func randomSlotBackoff() time.Duration {
	return time.Duration(rand.Int63n(int64(slotrecord.BackoffMax)))
}

// releaseChild gives back child's slot after its start failed
// (slotrecord.Records.Release: within what is left of ctx, then in the background
// within store.SettleBudget; a slot left behind still lapses after
// slotGrace).
func (c *Coordinator) releaseChild(ctx context.Context, parent, child string) {
	c.childSlots.Release(ctx, parent, func(rec childSlotsRecord) (childSlotsRecord, bool) {
		kept := slices.DeleteFunc(slices.Clone(rec.Slots), func(s childSlot) bool { return s.ChildID == child })
		return childSlotsRecord{Slots: kept}, len(kept) != len(rec.Slots)
	})
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

// liveChildIDs are the children of parent with a live agent now, or
// with a one-shot run or an epoch taken over from a dead host: it may be
// continued on another instance (continue.go), so it counts against the
// limit until it settles and its lease goes (chaos seed 1: a child
// admitted while another waited to be continued made 11 live, the limit
// 10).
func (c *Coordinator) liveChildIDs(parent string) map[string]bool {
	out := map[string]bool{}
	for _, l := range c.agents.childrenOf(parent) {
		if l.rec.Kind != protocol.AgentRoot && (c.leaseLive(l.rec) || awaitsContinuation(l.rec)) {
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

// awaitsContinuation reports whether rec is the lease of a one-shot run or
// a continuable child's epoch a coordinator took over from a dead host,
// which another instance may continue (docs/protocol.md §8.4, "Continued
// after a host loss"). An epoch's takeover that ends it instead holds the
// lease taken over only until the epoch is settled, so counting it then
// too only keeps its slot a moment longer.
func awaitsContinuation(rec protocol.AgentRecord) bool {
	return (rec.Kind == protocol.AgentOneShot || rec.Kind == protocol.AgentContinuable) && rec.TakenOverBy != "" && !rec.Ending
}
