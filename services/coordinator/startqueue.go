package coordinator

// The start queue (docs/protocol.md §5.5, "The start queue"; issue 32,
// item 4). A runs.start whose parent is at its live-children limit
// (LiveChildrenMax) is not refused: it waits in the parent's start queue,
// brood_agents `startqueue.<parent>` (protocol.StartQueueRecord), and its
// caller is answered at once with the run's ids and state queued. The run
// starts when a slot frees, oldest first; its RunNotice comes as for any
// run. The queue holds at most StartQueueMax starts and
// protocol.StartQueueBytesMax bytes: past either, a start is refused
// LIMIT_EXCEEDED naming the bound. A queued start is charged its child on
// the budgets its parent draws on when it is queued (a start the budget
// refuses is refused at once, never queued), and given it back if it never
// starts.
//
// The record is written only by coordinators, by compare-and-set (a
// deployment denies it to every worker user: docs/security.md). Every
// replica admits from every queue it sees (the agents watch keeps the
// parents whose queue has entries, agentIndex.queued), when a child of such
// a parent ends, when a queue changes, and every StartQueueSweepInterval.
// Order of the writes of one admission pass (admitQueued):
//
//	slots.<parent>, CAS, once per entry in queue order until the limit
//	refuses (the child's slot; taking it again is idempotent: the slot
//	names the child) → startqueue.<parent>, one CAS (those entries marked
//	admitting by this replica) → per entry, at once: the child's header and
//	run record (created once; found there, the run is taken as it is) →
//	provider start → startqueue.<parent>, one CAS (the started entries
//	removed)
//
// Entries are admitted (their slots taken) in queue order; the entries of
// one pass start concurrently, so their children's starts may interleave.
//
// So several replicas racing for one entry start it once: only one marks
// it (this replica's own changes of a queue wait for each other,
// queueLocks), and a replica that dies after marking it leaves it to another once
// its heartbeat record expired (or the mark is older than a start's
// budget), which finds the run's records if they were written and starts
// the run if no instance claimed it. A replica stopping finishes the
// admission in flight (within a start's budget) and starts no other.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator/slotrecord"
)

// StartQueueSweepInterval is how often a replica looks at every start queue
// it knows of, besides when a child of a queued parent ends.
const StartQueueSweepInterval = time.Second

// StartQueueConfirmInterval is how often a replica whose cache shows a
// queued parent at its live-children limit reads the leader to confirm it
// (the slot record and each counted child's lease, endedChildren): the
// cache sees a child end by its lease's deletion, which kicks the queue, so
// the leader is read only in case the cache missed one.
const StartQueueConfirmInterval = 10 * time.Second

// startQueueAdmitsMax bounds the starts one pass admits from one queue, so
// one parent's queue does not hold up the others'.
const startQueueAdmitsMax = 64

// queueOn reports whether a start at the limit waits in its parent's queue.
func (c *Coordinator) queueOn() bool { return c.cfg.StartQueueMax > 0 }

// kickQueues runs the start queues' admissions now.
func (c *Coordinator) kickQueues() {
	select {
	case c.queueKick <- struct{}{}:
	default:
	}
}

// queueStart puts an admitted runs.start (a, its parent's authority read
// fresh) at the end of its parent's start queue and answers it queued. The
// start is charged its child on the budgets its parent draws on first: a
// start the budget refuses is refused, not queued.
func (c *Coordinator) queueStart(ctx context.Context, a admission, req rpc.Request, r protocol.RunStartRequest, runID, childID string) (protocol.RunStartReply, error) {
	if _, err := c.authorizeFresh(ctx, r.Parent); err != nil {
		return protocol.RunStartReply{}, err
	}
	refund, err := c.admitBudget(ctx, a, childID)
	if err != nil {
		return protocol.RunStartReply{}, err
	}
	entry := protocol.QueuedStart{
		RunID: runID, ChildID: childID, Provider: a.desc.Name, CredentialHash: protocol.HashCredential(r.Parent.Credential),
		Prompt: r.Prompt, Notify: r.Notify, NotifyJSON: req.Encoding == protocol.JSON, Options: r.Options, QueuedAt: store.NowMs(),
	}
	entry.Options.Label = a.options.Label
	if err := c.enqueueStart(ctx, a.pheader.ID, entry); err != nil {
		refund()
		return protocol.RunStartReply{}, err
	}
	return protocol.RunStartReply{RunID: runID, ChildID: childID, State: protocol.RunQueued}, nil
}

// queueContinuable puts an admitted continuable.start (adm) of child
// childID at the end of its parent's start queue, as queueStart does a
// runs.start, and answers it queued with the child's id and its prompt's
// message id, drawn now (its first epoch's run id too). A child id in use
// (a session, or a start queued under this parent) is DUPLICATE_CHILD.
func (c *Coordinator) queueContinuable(ctx context.Context, adm continuableAdmission, childID string) (protocol.ContinuableStartReply, error) {
	if _, err := c.authorizeFresh(ctx, adm.r.Parent); err != nil {
		return protocol.ContinuableStartReply{}, err
	}
	if adm.r.ChildID != "" {
		if _, err := c.st.GetHeader(ctx, childID); err == nil {
			return protocol.ContinuableStartReply{}, protocol.NewError(protocol.CodeDuplicateChild, map[string]any{"childId": childID})
		} else if !errors.Is(err, store.ErrNotFound) {
			return protocol.ContinuableStartReply{}, protocol.Errorf(protocol.CodeUnavailable, "read the header of %s: %w", childID, err)
		}
	}
	refund, err := c.admitBudget(ctx, adm.a, childID)
	if err != nil {
		return protocol.ContinuableStartReply{}, err
	}
	entry := protocol.QueuedStart{
		RunID: ulid.Make().String(), ChildID: childID, Provider: adm.a.desc.Name, CredentialHash: protocol.HashCredential(adm.r.Parent.Credential),
		Prompt: adm.r.Prompt, Options: adm.opts, QueuedAt: store.NowMs(), Mode: protocol.ModeContinuable, MessageID: ulid.Make().String(),
	}
	if err := c.enqueueStart(ctx, adm.a.pheader.ID, entry); err != nil {
		refund()
		return protocol.ContinuableStartReply{}, err
	}
	return protocol.ContinuableStartReply{ChildID: childID, MessageID: entry.MessageID, State: protocol.StateQueued}, nil
}

// enqueueStart appends entry to parent's start queue, or refuses
// LIMIT_EXCEEDED naming the bound the queue is at (StartQueueMax entries,
// StartQueueBytesMax bytes), or DUPLICATE_CHILD when an entry names its
// child already; then kicks the admissions.
func (c *Coordinator) enqueueStart(ctx context.Context, parent string, entry protocol.QueuedStart) error {
	err := c.updateQueue(ctx, parent, func(q *protocol.StartQueueRecord) (bool, error) {
		if slices.ContainsFunc(q.Entries, func(e protocol.QueuedStart) bool { return e.ChildID == entry.ChildID }) {
			return false, protocol.NewError(protocol.CodeDuplicateChild, map[string]any{"childId": entry.ChildID})
		}
		if len(q.Entries) >= c.cfg.StartQueueMax {
			return false, protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
				"limit": "queued starts per parent", "reason": fmt.Sprintf("session %s is at its %d live children and %d starts wait in its queue; the limit is %d queued starts (StartQueueMax)",
					parent, c.cfg.LiveChildrenMax, len(q.Entries), c.cfg.StartQueueMax)})
		}
		q.Entries = append(q.Entries, entry)
		if data, err := protocol.Marshal(protocol.Msgpack, *q); err == nil && len(data) > protocol.StartQueueBytesMax {
			return false, protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
				"limit": "queued start bytes per parent", "reason": fmt.Sprintf("session %s's start queue would hold %d bytes; the limit is %d bytes (StartQueueBytesMax)",
					parent, len(data), protocol.StartQueueBytesMax)})
		}
		return true, nil
	})
	if err == nil {
		c.kickQueues()
	}
	return err
}

// updateQueue changes parent's start queue by compare-and-set: change is
// given the record as read from the leader (empty when there is none) and
// reports whether it changed it, or an error (a *protocol.Error is the
// answer as it is). At most slotrecord.AttemptsMax attempts.
func (c *Coordinator) updateQueue(ctx context.Context, parent string, change func(*protocol.StartQueueRecord) (bool, error)) error {
	// This replica's changes of one queue wait for each other: a burst of
	// starts racing on one record would mostly conflict.
	unlock, err := c.queueLocks.lock(ctx, parent)
	if err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "wait for this replica's other changes of the start queue of %s: %w", parent, err)
	}
	defer unlock()
	for attempt := 0; attempt < slotrecord.AttemptsMax; attempt++ {
		cur, err := c.st.StartQueue(ctx, parent)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return protocol.Errorf(protocol.CodeUnavailable, "read the start queue of %s: %w", parent, err)
		}
		q := protocol.StartQueueRecord{Entries: slices.Clone(cur.Value.Entries)}
		changed, err := change(&q)
		if err != nil || !changed {
			return err
		}
		_, err = c.st.WriteStartQueue(ctx, parent, q, cur.Revision)
		if err == nil {
			return nil
		}
		if !errors.Is(err, store.ErrConflict) {
			return protocol.Errorf(protocol.CodeUnavailable, "write the start queue of %s: %w", parent, err)
		}
		select {
		case <-ctx.Done():
			return protocol.Errorf(protocol.CodeUnavailable, "write the start queue of %s: %w", parent, ctx.Err())
		case <-time.After(c.slotBackoff()):
		}
	}
	return protocol.Errorf(protocol.CodeUnavailable, "the start queue of %s kept changing; retry", parent)
}

// startQueues admits from the start queues until ctx is done: at once when
// kicked (kickQueues), else every StartQueueSweepInterval.
func (c *Coordinator) startQueues(ctx context.Context) {
	t := time.NewTicker(StartQueueSweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.queueKick:
		case <-t.C:
		}
		for _, parent := range c.agents.queuedParents() {
			if ctx.Err() != nil {
				return
			}
			if may, confirm := c.queueMayAdmit(parent, time.Now()); may {
				c.admitQueued(ctx, parent, confirm)
			}
		}
	}
}

// queueMayAdmit reports whether an admission pass of parent's queue may
// take a slot, from this replica's cache first (issue 32, item 4): while
// the leases it caches make the parent full, no pass reads anything, but
// one every StartQueueConfirmInterval, which confirms it from the leader
// (confirm true: the slot's refusal then reads the counted children
// fresh). A pass the cache lets in reads the queue, the parent's lease and
// the slot record, and is refused by the slot record without those fresh
// reads (the slots it counts beside the cached leases are of starts on
// their way). Before, every pass read each counted child's lease from the
// leader before the refusal: about 128 leader reads per child end at 64
// live children with two replicas, and 64 a second per replica.
func (c *Coordinator) queueMayAdmit(parent string, now time.Time) (may, confirm bool) {
	if len(c.liveChildIDs(parent)) < c.cfg.LiveChildrenMax {
		// The last confirmation is kept: a parent full again after one of
		// its children ended (and a queued start took its place) is not
		// confirmed at once, which would read every child at each end.
		return true, false
	}
	if now.Sub(c.queueConfirmed[parent]) < StartQueueConfirmInterval {
		return false, false
	}
	if c.queueConfirmed == nil || len(c.queueConfirmed) >= keyedLocksMax {
		c.queueConfirmed = map[string]time.Time{}
	}
	c.queueConfirmed[parent] = now
	return true, true
}

// admitQueued admits the first starts of parent's queue while the parent
// has free slots (at most startQueueAdmitsMax in one pass), as the package
// comment orders: it takes their slots in queue order, stopping at the
// first the limit refuses, marks them admitting in one write, starts them
// at once (at most startQueueStartsMax at a time) and removes them in one
// write. An entry another live replica marked is left to it. A start whose
// parent is gone, or that its admission checks now refuse, is settled never
// started (its caller notified) and removed; one whose parent's host is
// being taken over waits. The pass is finished even if the replica stops
// meanwhile (within a start's budget): a stop must not leave a start half
// made. fresh: a refusal of the slot reads the counted children from the
// leader first (queueMayAdmit's confirmation).
func (c *Coordinator) admitQueued(ctx context.Context, parent string, fresh bool) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.RequestBudget)
	defer cancel()
	cur, err := c.st.StartQueue(actx, parent)
	if errors.Is(err, store.ErrNotFound) || (err == nil && len(cur.Value.Entries) == 0) {
		c.agents.setQueued(parent, false)
		return
	}
	if err != nil {
		c.log.Warn("start queue not read", "parent", parent, "err", err)
		return
	}
	lease, err := c.st.LeaseLatest(actx, parent)
	switch {
	case errors.Is(err, store.ErrNotFound):
		for _, e := range firstN(cur.Value.Entries, startQueueAdmitsMax) {
			c.failQueued(actx, parent, e, protocol.Errorf(protocol.CodeUnauthorized, "the parent session %s ended while the start waited in its queue", parent))
		}
		c.kickQueues()
		return
	case err != nil:
		return
	case !c.leaseLive(lease.Value):
		return // its host is dead and the session not taken over yet, or its run is ending
	}
	l := leaseState{rec: lease.Value, rev: lease.Revision}
	var batch []protocol.QueuedStart
	for _, e := range cur.Value.Entries {
		if len(batch) >= startQueueAdmitsMax {
			break
		}
		if e.AdmittingBy != "" && e.AdmittingBy != c.cfg.ID && c.reg.HostLive(e.AdmittingBy) &&
			store.NowMs()-e.AdmittingAt < c.cfg.RequestBudget.Milliseconds() {
			continue // another replica admits it
		}
		if e.CredentialHash != lease.Value.CredentialHash {
			c.failQueued(actx, parent, e, notLiveCredential(parent))
			continue
		}
		if err := c.reserveSlot(actx, parent, e.ChildID, "", fresh); err != nil {
			break // at the limit still (or the slot record unreadable): a later pass
		}
		batch = append(batch, e)
	}
	if batch = c.claimQueued(actx, parent, batch); len(batch) == 0 {
		return
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		done []string
	)
	sem := make(chan struct{}, startQueueStartsMax)
	for _, e := range batch {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			started, err := c.startQueued(actx, l, e)
			switch {
			case err != nil && protocol.CodeOf(err) == protocol.CodeUnavailable && !started:
				// Nothing was decided: the entry stays marked, and is
				// taken again by a later pass (its mark is this
				// replica's).
				c.log.Warn("a queued start not admitted yet", "parent", parent, "run", e.RunID, "err", err)
			case err != nil:
				c.failQueued(actx, parent, e, err)
			default:
				mu.Lock()
				done = append(done, e.RunID)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	c.dequeue(actx, parent, done...)
	if len(done) == len(batch) {
		c.kickQueues() // there may be more room
	}
}

// startQueueStartsMax bounds the starts of one pass in flight at once.
const startQueueStartsMax = 16

func firstN[T any](s []T, n int) []T { return s[:min(len(s), n)] }

// claimQueued marks the entries of batch that are still in parent's queue
// and not marked by another replica since as admitting by this one, in one
// write, and returns them (in queue order). An entry another replica took
// meanwhile holds the same slot there (the slot names its child).
func (c *Coordinator) claimQueued(ctx context.Context, parent string, batch []protocol.QueuedStart) []protocol.QueuedStart {
	if len(batch) == 0 {
		return nil
	}
	seen := make(map[string]string, len(batch)) // run id → its mark when read
	for _, e := range batch {
		seen[e.RunID] = e.AdmittingBy
	}
	var claimed []protocol.QueuedStart
	err := c.updateQueue(ctx, parent, func(q *protocol.StartQueueRecord) (bool, error) {
		claimed = claimed[:0]
		now := store.NowMs()
		changed := false
		for i, e := range q.Entries {
			by, ok := seen[e.RunID]
			if !ok || e.AdmittingBy != by {
				continue
			}
			// An entry this replica marked less than half a start's budget
			// ago (a pass whose start was not decided) is taken again
			// without a write: each write is a queue change every replica
			// sees and admits from at once, so a start that kept failing
			// (its provider down) was retried in a busy loop, not once per
			// StartQueueSweepInterval.
			if by != c.cfg.ID || now-e.AdmittingAt >= c.cfg.RequestBudget.Milliseconds()/2 {
				e.AdmittingBy, e.AdmittingAt = c.cfg.ID, now
				q.Entries[i] = e
				changed = true
			}
			claimed = append(claimed, e)
		}
		return changed, nil
	})
	if err != nil {
		c.log.Warn("queued starts not marked admitting", "parent", parent, "err", err)
		return nil
	}
	return claimed
}

// dequeue removes the entries of runIDs from parent's queue, in one write.
func (c *Coordinator) dequeue(ctx context.Context, parent string, runIDs ...string) {
	if len(runIDs) == 0 {
		return
	}
	err := c.updateQueue(ctx, parent, func(q *protocol.StartQueueRecord) (bool, error) {
		n := len(q.Entries)
		q.Entries = slices.DeleteFunc(q.Entries, func(e protocol.QueuedStart) bool { return slices.Contains(runIDs, e.RunID) })
		return len(q.Entries) != n, nil
	})
	if err != nil {
		// Left there, they are found admitted (their runs' records exist)
		// by a later pass, which removes them.
		c.log.Warn("admitted starts not removed from their queue", "parent", parent, "runs", len(runIDs), "err", err)
	}
}

// keyedLocks are locks by key (a parent's start queue), each taken within a
// context; at most keyedLocksMax keys are kept (past it the map starts
// over, which only lets two changes of one queue race on its record).
type keyedLocks struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

const keyedLocksMax = 10000

// lock takes key's lock, or returns ctx's error once ctx is done first.
func (k *keyedLocks) lock(ctx context.Context, key string) (unlock func(), err error) {
	k.mu.Lock()
	if k.m == nil || len(k.m) >= keyedLocksMax {
		k.m = map[string]chan struct{}{}
	}
	ch := k.m[key]
	if ch == nil {
		ch = make(chan struct{}, 1)
		k.m[key] = ch
	}
	k.mu.Unlock()
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
