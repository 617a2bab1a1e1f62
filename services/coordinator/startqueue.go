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

// startQueued writes a queued start's child header and run record and asks
// a provider instance to publish the child, as runsStart does, once its
// admission checks pass again against the parent's lease (l, whose
// credential hash the entry names). A run record already there (a replica
// that admitted the entry died) is taken as it is: started when an instance
// claimed or settled it, else started now. started reports that the run's
// records exist: an error then has settled it.
func (c *Coordinator) startQueued(ctx context.Context, l leaseState, e protocol.QueuedStart) (started bool, err error) {
	if e.Continuable() {
		return c.startQueuedContinuable(ctx, l, e)
	}
	desc, err := c.lookupProvider(e.Provider)
	if err != nil {
		return false, err
	}
	if err := checkCapabilities(desc, e.Options); err != nil {
		return false, err
	}
	a, err := c.admitResolved(ctx, desc, l, l.rec.SessionID, e.Prompt, e.Options)
	if err != nil {
		return false, err
	}
	r := protocol.RunStartRequest{Provider: e.Provider, Parent: protocol.ParentRef{SessionID: l.rec.SessionID}, Prompt: e.Prompt, Notify: e.Notify, Options: e.Options}
	start, runRev, err := c.createQueuedRun(ctx, a, r, e)
	if err != nil || start == nil {
		return err == nil, err
	}
	dctx, cancel := reserve(ctx)
	_, err = c.dispatch(dctx, a.desc.Name, protocol.OpProviderStart, e.RunID, func(deadline int64) any {
		start.Deadline = deadline
		return start
	}, &protocol.ProviderStartReply{})
	cancel()
	if err != nil && (errors.Is(err, protocol.ErrNotPending) || c.failRun(ctx, start.Run, runRev, err)) {
		_, err = c.claimedRun(ctx, start.Run, runRev, err)
	}
	if err != nil {
		// Settled never started (failRun), or unread: either way its
		// caller hears from the run record (the notice, runs.await).
		if run, rerr := c.st.RunLatest(ctx, e.RunID); rerr == nil && run.Value.State == protocol.RunSettled {
			c.st.PublishRunNotice(run.Value, func(err error) { c.log.Warn("queued run's notice not sent", "run", e.RunID, "err", err) })
			c.releaseChild(ctx, a.pheader.ID, e.ChildID)
			c.refundQueued(ctx, a.pheader.ID, e.ChildID)
		}
		return true, nil
	}
	c.cfg.Metrics.StartAnswered(start.Run.Provider, start.Run.Mode, time.Since(time.UnixMilli(e.QueuedAt)))
	return true, nil
}

// startQueuedContinuable starts a queued continuable.start as
// continuableStart does once its slot is taken: its admission checks run
// again against the parent's lease (l), then its header (one written by an
// admission of it before is taken as it is), its first epoch (run id
// e.RunID) and its prompt (message id e.MessageID, stored once however
// often it is enqueued). started reports that the prompt is in the child's
// inbox.
func (c *Coordinator) startQueuedContinuable(ctx context.Context, l leaseState, e protocol.QueuedStart) (started bool, err error) {
	desc, err := c.lookupProvider(e.Provider)
	if err != nil {
		return false, err
	}
	if !desc.Continuable {
		return false, protocol.NewError(protocol.CodeUnsupportedCapability, map[string]any{"provider": e.Provider, "capability": "continuable children"})
	}
	desc = continuableDesc(desc)
	if err := checkCapabilities(desc, e.Options); err != nil {
		return false, err
	}
	parent := l.rec.SessionID
	lineage := append(append([]string(nil), l.rec.Ancestry...), parent)
	if err := c.checkDraining(lineage); err != nil {
		return false, err
	}
	a, err := c.admitResolved(ctx, desc, l, parent, e.Prompt, e.Options)
	if err != nil {
		return false, err
	}
	adm := continuableAdmission{
		r:      protocol.ContinuableStartRequest{Provider: e.Provider, Parent: protocol.ParentRef{SessionID: parent}, Label: e.Options.Label, ChildID: e.ChildID, Prompt: e.Prompt},
		parent: l, lineage: lineage, a: a, opts: e.Options,
	}
	header, err := c.writeContinuableChild(ctx, adm, e.ChildID)
	if protocol.CodeOf(err) == protocol.CodeDuplicateChild {
		// Written by an admission of this start before (a replica that
		// died), or the id taken meanwhile by another start.
		h, herr := c.st.GetHeader(ctx, e.ChildID)
		if herr != nil || h.ParentSession != parent || h.Provider != desc.Name {
			return false, err
		}
		header, err = h, nil
	}
	if err != nil {
		return false, err
	}
	recheck := func(ctx context.Context) error {
		lease, err := c.st.LeaseLatest(ctx, parent)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return protocol.Errorf(protocol.CodeUnauthorized, "the parent session %s ended while the start waited in its queue", parent)
		case err != nil:
			return protocol.Errorf(protocol.CodeUnavailable, "read the lease of %s: %w", parent, err)
		case lease.Value.CredentialHash != e.CredentialHash || !c.leaseLive(lease.Value):
			return notLiveCredential(parent)
		}
		return nil
	}
	// The slot and the budget charge are given back by failQueued when
	// the start fails (a rollback's dispose that failed keeps nothing).
	if _, err := c.startFirstEpoch(ctx, adm, header, func() {}, e.RunID, e.MessageID, recheck); err != nil {
		return false, err
	}
	c.cfg.Metrics.StartAnswered(desc.Name, protocol.ModeContinuable, time.Since(time.UnixMilli(e.QueuedAt)))
	return true, nil
}

// createQueuedRun writes a queued start's records as createRun does, each
// taken as it is when a replica that admitted the entry before wrote it: it
// returns nil (and no error) when the run is claimed or settled already.
func (c *Coordinator) createQueuedRun(ctx context.Context, a admission, r protocol.RunStartRequest, e protocol.QueuedStart) (*protocol.ProviderStartRequest, uint64, error) {
	if run, err := c.st.RunLatest(ctx, e.RunID); err == nil {
		if run.Value.State != protocol.RunRunning || run.Value.HostID != "" {
			return nil, 0, nil
		}
		header, err := c.st.GetHeader(ctx, e.ChildID)
		if err != nil {
			return nil, 0, protocol.Errorf(protocol.CodeUnavailable, "read the header of queued child %s: %w", e.ChildID, err)
		}
		return c.providerStart(a, r, e, header, run.Value, run.Revision), run.Revision, nil
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, 0, protocol.Errorf(protocol.CodeUnavailable, "read run %s: %w", e.RunID, err)
	}
	now := store.NowMs()
	header := c.childHeader(a, e.ChildID, now)
	if a.budget != nil && len(a.pheader.Budgets) == 0 {
		header.BudgetStartTokens = protocol.BudgetStartGrant(*a.budget, int64(len(protocol.AllText(r.Prompt))))
	}
	if a.desc.InheritsParentContext {
		seed, err := c.prepare(ctx, a.desc.Name, a.pheader, e.ChildID)
		if err != nil {
			return nil, 0, err
		}
		header.SeedLength = seed
	}
	rec := protocol.RunRecord{
		RunID: e.RunID, ChildID: e.ChildID, ParentSession: a.pheader.ID, Provider: a.desc.Name,
		Mode: protocol.ModeOneShot, Notify: e.Notify, NotifyJSON: e.NotifyJSON, Structured: a.options.OutputSchema != "", Remote: a.desc.Remote,
		State: protocol.RunRunning, CreatedAt: now,
	}
	if err := c.st.PutHeader(ctx, header); errors.Is(err, store.ErrConflict) {
		if header, err = c.st.GetHeader(ctx, e.ChildID); err != nil {
			return nil, 0, protocol.Errorf(protocol.CodeUnavailable, "read the header of queued child %s: %w", e.ChildID, err)
		}
	} else if err != nil {
		return nil, 0, protocol.Errorf(protocol.CodeUnavailable, "record the run: %w", err)
	}
	if err := c.createOwnBudget(ctx, a, header, e.RunID); err != nil {
		return nil, 0, err
	}
	runRev, err := c.st.CreateRun(ctx, rec)
	if errors.Is(err, store.ErrConflict) {
		return c.createQueuedRun(ctx, a, r, e) // another replica's, a moment ago
	}
	if err != nil {
		return nil, 0, protocol.Errorf(protocol.CodeUnavailable, "record the run: %w", err)
	}
	c.cfg.Metrics.RunStarted(rec.Provider, rec.Mode)
	c.st.PutChildIndexAsync(header.ParentSession, protocol.ChildIndexRecord{
		ChildID: e.ChildID, CreatedAt: now, Mode: protocol.ModeOneShot, Provider: a.desc.Name,
	}, func(err error) { c.log.Warn("child index entry not written", "child", e.ChildID, "err", err) })
	c.headers.add(header)
	return c.providerStart(a, r, e, header, rec, runRev), runRev, nil
}

// providerStart is the provider start that publishes a queued run.
func (c *Coordinator) providerStart(a admission, r protocol.RunStartRequest, e protocol.QueuedStart, header protocol.SessionHeader, rec protocol.RunRecord, rev uint64) *protocol.ProviderStartRequest {
	return &protocol.ProviderStartRequest{
		RunID: e.RunID, Header: header, Provider: a.desc.Name, Prompt: r.Prompt, Notify: e.Notify, NotifyJSON: e.NotifyJSON,
		Source: ptrTo(protocol.PromptSource(a.pheader)), RunRevision: protocol.Seq(rev), Run: rec, Options: a.options, Ancestry: ancestry(a),
	}
}

// failQueued settles a queued start that will never start with cause:
// its entry is taken out of the queue, and only when this call took it
// out (two replicas' passes over a parent gone fail the same entries at
// once, and a pass fails again an entry whose removal failed before) is
// it settled (settleQueued). An entry the queue's write could not remove
// stays for a later pass.
func (c *Coordinator) failQueued(ctx context.Context, parent string, e protocol.QueuedStart, cause error) {
	took := false
	err := c.updateQueue(ctx, parent, func(q *protocol.StartQueueRecord) (bool, error) {
		n := len(q.Entries)
		q.Entries = slices.DeleteFunc(q.Entries, func(x protocol.QueuedStart) bool { return x.RunID == e.RunID })
		took = len(q.Entries) != n
		return took, nil
	})
	if err != nil || !took {
		if err != nil {
			c.log.Warn("a queued start that cannot start not taken out of its queue; a later pass fails it", "parent", parent, "run", e.RunID, "err", err)
		}
		return
	}
	c.settleQueued(ctx, parent, e, cause)
}

// settleQueued settles queued start e, which its caller took out of
// parent's queue (once: the charge is given back here), with cause: its
// run record is written settled never started (so runs.await answers it),
// its caller notified, and its slot and budget charge given back.
func (c *Coordinator) settleQueued(ctx context.Context, parent string, e protocol.QueuedStart, cause error) {
	rec := protocol.RunRecord{
		RunID: e.RunID, ChildID: e.ChildID, ParentSession: parent, Provider: e.Provider,
		Mode: queuedMode(e), Notify: e.Notify, NotifyJSON: e.NotifyJSON, State: protocol.RunRunning, CreatedAt: store.NowMs(),
	}
	if protocol.ValidID(e.Provider) {
		if rev, err := c.st.CreateRun(ctx, rec); err == nil {
			settled := store.NotStarted(rec, c.cfg.ID, cause)
			if won, err := c.st.SettleRun(ctx, settled, rev); err == nil && won {
				c.settled(settled)
				c.st.PublishRunNotice(settled, func(err error) { c.log.Warn("queued run's notice not sent", "run", e.RunID, "err", err) })
			}
		} else if !errors.Is(err, store.ErrConflict) {
			c.log.Warn("a queued start that cannot start not recorded", "run", e.RunID, "err", err)
		}
	}
	c.releaseChild(ctx, parent, e.ChildID)
	c.refundQueued(ctx, parent, e.ChildID)
	c.log.Info("a queued start will not start", "parent", parent, "run", e.RunID, "err", cause)
}

// refundQueued gives a queued start's child back to the budgets its parent
// draws on (charged when it was queued).
func (c *Coordinator) refundQueued(ctx context.Context, parent, childID string) {
	ph, err := c.headers.get(ctx, c.st, parent)
	if err != nil {
		c.log.Warn("a queued start's child not given back to its budgets", "child", childID, "err", err)
		return
	}
	if len(ph.Budgets) == 0 {
		return
	}
	if err := c.budgetRefund(context.WithoutCancel(ctx), ph.Budgets, protocol.BudgetSpend{Children: 1}); err != nil {
		c.log.Warn("a queued start's child not given back to its budgets", "child", childID, "err", err)
	}
}

// queuedMode is the mode of the child a queued start makes.
func queuedMode(e protocol.QueuedStart) string {
	if e.Continuable() {
		return protocol.ModeContinuable
	}
	return protocol.ModeOneShot
}

// queuedRun finds run runID (or a queued start's child id) in
// parent's start queue: a run record of state RunQueued, or found false;
// queues reports that parent has a start queue.
func (c *Coordinator) queuedRun(ctx context.Context, parent, runID string) (_ protocol.RunRecord, found, queues bool) {
	cur, err := c.st.StartQueue(ctx, parent)
	if err != nil {
		return protocol.RunRecord{}, false, !errors.Is(err, store.ErrNotFound)
	}
	for _, e := range cur.Value.Entries {
		// Or named by its child id: a queued continuable child's first
		// epoch's run id is the coordinator's until it starts, and a
		// remote run's child is listed by its own id (children.list).
		if e.RunID == runID || e.ChildID == runID {
			return protocol.RunRecord{RunID: e.RunID, ChildID: e.ChildID, ParentSession: parent, Provider: e.Provider,
				Mode: queuedMode(e), State: protocol.RunQueued, CreatedAt: e.QueuedAt}, true, true
		}
	}
	return protocol.RunRecord{}, false, true
}

// queueLeftWait bounds how long loadRun waits for the record of a run
// found neither recorded nor queued under a parent that has a start queue:
// an entry leaves the queue (admitted, or disposed by a concurrent
// request) a moment before its run's record is written.
const queueLeftWait = 2 * time.Second

// runLeftQueue reads run runID's record from the leader until it is there
// or queueLeftWait passed (store.ErrNotFound then).
func (c *Coordinator) runLeftQueue(ctx context.Context, runID string) (store.Record[protocol.RunRecord], error) {
	deadline := time.Now().Add(queueLeftWait)
	for {
		rec, err := c.st.RunLatest(ctx, runID)
		if !errors.Is(err, store.ErrNotFound) || !time.Now().Before(deadline) {
			return rec, err
		}
		select {
		case <-ctx.Done():
			return rec, err
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// queuedRows are the children.list rows of parent's queued starts, oldest
// first: state queued, the mode of the child each makes.
func (c *Coordinator) queuedRows(ctx context.Context, parent string) []protocol.ChildRow {
	if !c.agents.hasQueue(parent) {
		return nil
	}
	cur, err := c.st.StartQueue(ctx, parent)
	if err != nil {
		return nil
	}
	rows := make([]protocol.ChildRow, 0, len(cur.Value.Entries))
	for _, e := range cur.Value.Entries {
		rows = append(rows, protocol.ChildRow{Kind: protocol.RowChild, ID: e.ChildID, Activity: protocol.ActivityInactive, State: protocol.RunQueued, Mode: queuedMode(e),
			Provider: e.Provider, Label: e.Options.Label, CreatedAt: e.QueuedAt})
	}
	return rows
}

// disposeQueued disposes a queued run q: its entry leaves the queue and
// the run is settled never started, cancelled (its caller notified, its
// budget charge given back). An entry a replica is admitting now is
// disposed as a started run once its record is there.
func (c *Coordinator) disposeQueued(ctx context.Context, q protocol.RunRecord) (protocol.RunStatus, error) {
	var removed *protocol.QueuedStart
	err := c.updateQueue(ctx, q.ParentSession, func(rec *protocol.StartQueueRecord) (bool, error) {
		removed = nil
		i := slices.IndexFunc(rec.Entries, func(e protocol.QueuedStart) bool { return e.RunID == q.RunID })
		if i < 0 || rec.Entries[i].AdmittingBy != "" {
			return false, nil
		}
		e := rec.Entries[i]
		removed = &e
		rec.Entries = slices.Delete(rec.Entries, i, i+1)
		return true, nil
	})
	if err != nil {
		return protocol.RunStatus{}, err
	}
	if removed != nil {
		c.settleQueued(ctx, q.ParentSession, *removed, protocol.NewError(protocol.CodeCancelled, map[string]any{"reason": "the run was disposed while its start waited in its parent's queue"}))
	}
	run, err := c.st.RunLatest(ctx, q.RunID)
	for wait := time.Now().Add(c.disposeWait()); errors.Is(err, store.ErrNotFound) && time.Now().Before(wait); run, err = c.st.RunLatest(ctx, q.RunID) {
		select {
		case <-ctx.Done():
			return protocol.RunStatus{}, protocol.Errorf(protocol.CodeUnavailable, "dispose queued run %s: %w", q.RunID, ctx.Err())
		case <-time.After(queuedPollInterval):
		}
	}
	if err != nil {
		return protocol.RunStatus{}, protocol.Errorf(protocol.CodeUnavailable, "read run %s: %w", q.RunID, err)
	}
	if run.Value.State == protocol.RunSettled {
		return status(run.Value), nil
	}
	return c.disposeRun(ctx, run.Value, protocol.CauseDisposed)
}

// queuedChild finds continuable child childID while its start waits in its
// parent's queue, asked with auth: its parent's credential, or a user
// grant covering the parent's tree (as for a started child). ok is false
// when it is not queued there (or auth may not see it: the caller answers
// as for an unknown child).
func (c *Coordinator) queuedChild(ctx context.Context, childID string, auth protocol.Authority) (e protocol.QueuedStart, ok bool) {
	parent := c.agents.queuedParentOf(childID)
	switch {
	case auth.Grant != "":
		g, err := c.grantOf(ctx, auth.Grant)
		if err != nil || parent == "" || c.grantCoversQueued(ctx, g, auth.Grant, parent, func() error { return errHidden }) != nil {
			return e, false
		}
	case auth.Parent != nil:
		if parent != auth.Parent.SessionID && !c.agents.hasQueue(auth.Parent.SessionID) {
			return e, false
		}
		if _, err := c.authorize(ctx, *auth.Parent); err != nil {
			return e, false
		}
		parent = auth.Parent.SessionID
	default:
		return e, false
	}
	cur, err := c.st.StartQueue(ctx, parent)
	if err != nil {
		return e, false
	}
	for _, e := range cur.Value.Entries {
		if e.Continuable() && e.ChildID == childID {
			return e, true
		}
	}
	return e, false
}

// errHidden stands for the refusal queuedChild does not answer.
var errHidden = errors.New("not covered")
