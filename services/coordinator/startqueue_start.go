package coordinator

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Starting an entry the start queue admitted, and ending one that cannot
// start (startqueue.go has the queue and its admission passes).

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
