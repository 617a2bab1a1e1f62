package coordinator

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// claimedRun tells what became of a run whose record changed under the
// coordinator (read from the leader): nil when an instance started (or is
// starting) the child, else the error the run was settled with never
// started. A record still unclaimed means the change was not a claim: the
// run is settled never started with cause, and cause is returned. The
// read waits out an election within ctx (the caller's deadline, less the
// margin to answer; it was a fixed store.WriteBudget past it, so the answer
// could come after the caller stopped waiting): when it runs out, the
// answer is UNAVAILABLE and unread is true (the run may be live: its slot
// stays).
func (c *Coordinator) claimedRun(ctx context.Context, rec protocol.RunRecord, rev uint64, cause error) (unread bool, err error) {
	for attempt := 0; attempt < claimReadsMax; attempt++ {
		run, err := c.st.RunLatest(ctx, rec.RunID)
		switch {
		case err != nil:
			return true, protocol.Errorf(protocol.CodeUnavailable, "read run %s, claimed by an instance that did not answer in time: %w", rec.RunID, err)
		case run.Value.NotStarted && run.Value.Result != nil:
			return false, protocol.Errorf(run.Value.Result.ErrorCode, "%s", run.Value.Result.Diagnostic)
		case run.Value.State == protocol.RunSettled || run.Value.HostID != "":
			return false, nil
		}
		if !c.failRun(ctx, rec, rev, cause) {
			return false, cause
		}
	}
	return false, cause
}

// claimReadsMax bounds the reads of a run record whose state keeps changing.
const claimReadsMax = 3

// failRun settles a run that no instance took, so nobody waits on it and no
// instance starts it late (the CAS at the creation revision fences every
// claim out). It reports true when an instance claimed the run first: then
// the run is that instance's, and the start succeeded after all. The write
// gets what is left of ctx's budget, then goes on in the background.
func (c *Coordinator) failRun(ctx context.Context, rec protocol.RunRecord, rev uint64, cause error) bool {
	rec = store.NotStarted(rec, c.cfg.ID, cause)
	settle := func(ctx context.Context) (claimed bool, err error) {
		won, err := c.st.SettleRun(ctx, rec, rev)
		return err == nil && !won, err
	}
	claimed, err := settle(ctx)
	if err == nil {
		if !claimed {
			c.settled(rec)
		}
		return claimed
	}
	// Out of budget: answer now, keep settling (the fence) in the background.
	go func() {
		bctx, cancel := context.WithTimeout(context.Background(), store.SettleBudget)
		defer cancel()
		if claimed, err := settle(bctx); err != nil {
			c.log.Error("could not settle a run that failed to start; it stays running", "run", rec.RunID, "err", err)
		} else if !claimed {
			c.settled(rec)
		}
	}()
	return false
}

// settled counts a settlement this replica won (brood_runs_settled_total and
// the delegation's duration from its record).
func (c *Coordinator) settled(rec protocol.RunRecord) {
	c.cfg.Metrics.RunSettled(rec.Provider, rec.Mode, *rec.Result, time.Duration(rec.SettledAt-rec.CreatedAt)*time.Millisecond)
}

// loadRun checks the authority of ref, then reads its run: the run's
// parent with its live credential, or a user grant that covers the run's
// child (docs/design.md §7, Settlement 4); a run whose start waits in its
// parent's queue (startqueue.go) is found as a record of state queued, by
// a grant through the queues this replica watches (its parent's tree then
// decides). Authority comes first: a caller that
// may not act on a run gets the same UNAUTHORIZED whether the run exists or
// not, so run ids cannot be probed; only a grant over every session learns
// NOT_FOUND (issue 17).
func (c *Coordinator) loadRun(ctx context.Context, ref protocol.RunRef) (store.Record[protocol.RunRecord], error) {
	var none store.Record[protocol.RunRecord]
	if !protocol.ValidID(ref.RunID) {
		return none, protocol.Errorf(protocol.CodeInvalidArgument, "runId must match ^[A-Za-z0-9_-]{1,64}$")
	}
	var g grantScope
	switch {
	case ref.Grant != "":
		var err error
		if g, err = c.grantOf(ctx, ref.Grant); err != nil {
			return none, err
		}
	case ref.Parent != nil:
		if _, err := c.authorize(ctx, *ref.Parent); err != nil {
			return none, err
		}
	default:
		return none, protocol.Errorf(protocol.CodeUnauthorized, "acting on a run needs the parent's credential or a user grant")
	}
	hidden := func() error {
		if ref.Parent != nil && ref.Grant == "" {
			return protocol.Errorf(protocol.CodeUnauthorized, "run %s is not a run of session %s (or does not exist)", ref.RunID, ref.Parent.SessionID)
		}
		return protocol.Errorf(protocol.CodeUnauthorized, "run %s is not in a tree of a root user %s opened (or does not exist)", ref.RunID, g.user)
	}
	rec, queued, err := c.runOrQueued(ctx, ref, g, hidden)
	if queued {
		return rec, err
	}
	if errors.Is(err, store.ErrNotFound) {
		if g.all {
			return rec, protocol.NewError(protocol.CodeNotFound, map[string]any{"what": "run " + ref.RunID})
		}
		return rec, hidden()
	}
	if err != nil {
		return rec, protocol.Errorf(protocol.CodeUnavailable, "read run %s: %w", ref.RunID, err)
	}
	switch {
	case ref.Grant == "" && ref.Parent.SessionID != rec.Value.ParentSession:
		return rec, hidden()
	case ref.Grant != "" && !g.all:
		h, err := c.headers.get(ctx, c.st, rec.Value.ChildID)
		if errors.Is(err, store.ErrNotFound) {
			// A start settled never started in its parent's queue (disposed,
			// refused at its admission) has no child header: the tree is its
			// parent's.
			return rec, c.grantCoversQueued(ctx, g, ref.Grant, rec.Value.ParentSession, hidden)
		}
		if err != nil {
			return rec, protocol.Errorf(protocol.CodeUnavailable, "read the header of %s: %w", rec.Value.ChildID, err)
		}
		if ok, err := g.covers(ctx, c, h); err != nil || !ok {
			if err != nil {
				return rec, err
			}
			return rec, hidden()
		}
	}
	return rec, nil
}

// runOrQueued reads the record of run ref.RunID for loadRun, or, when it
// has none, finds the start that waits in its parent's queue: the parent's
// credential names its queue, a grant finds it by the run id in the queues
// this replica watches (agentIndex.queuedRuns). queued reports a start
// found in a queue, returned as a record of state queued with err the
// grant's verdict on it; otherwise rec and err are the record's read (a
// start that just left its queue is waited for: runLeftQueue).
func (c *Coordinator) runOrQueued(ctx context.Context, ref protocol.RunRef, g grantScope, hidden func() error) (rec store.Record[protocol.RunRecord], queued bool, err error) {
	rec, err = c.st.Run(ctx, ref.RunID)
	if errors.Is(err, store.ErrNotFound) {
		// A continuable child (or a remote run's child) whose start left
		// its parent's queue settled never started has no session: its
		// run record is found by its child id (agentIndex.leftQueue).
		if left, ok := c.neverStartedRun(ctx, ref.RunID); ok {
			rec, err = left, nil
		}
	}
	if !errors.Is(err, store.ErrNotFound) {
		return rec, false, err
	}
	parent := c.agents.queuedParentOf(ref.RunID)
	if ref.Grant == "" {
		parent = ref.Parent.SessionID
	}
	if parent == "" {
		return rec, false, err
	}
	q, ok, queues := c.queuedRun(ctx, parent, ref.RunID)
	switch {
	case ok:
		if err := c.grantCoversQueued(ctx, g, ref.Grant, parent, hidden); err != nil {
			return store.Record[protocol.RunRecord]{}, true, err
		}
		return store.Record[protocol.RunRecord]{Value: q}, true, nil
	case queues:
		// Its start may have just left the queue (admitted, or disposed
		// by another request): the entry goes before the record is
		// written, so wait for the record a little.
		rec, err = c.runLeftQueue(ctx, ref.RunID)
	}
	return rec, false, err
}

// neverStartedRun reads the run record of the start of child childID that
// this replica saw leave its parent's start queue under another run id,
// when that run was settled never started (disposed in its queue, refused
// at its admission); ok is false otherwise (a child admitted and started
// is answered by its own session: its header is there, and nothing is
// read or waited for). Waits for the record as runLeftQueue.
func (c *Coordinator) neverStartedRun(ctx context.Context, childID string) (_ store.Record[protocol.RunRecord], ok bool) {
	runID := c.agents.leftQueueRun(childID)
	if runID == "" {
		return store.Record[protocol.RunRecord]{}, false
	}
	if _, err := c.headers.get(ctx, c.st, childID); !errors.Is(err, store.ErrNotFound) {
		// It started (or its header is not read now): no wait for a run
		// record that may have expired since (RunsTTL).
		return store.Record[protocol.RunRecord]{}, false
	}
	rec, err := c.runLeftQueue(ctx, runID)
	if err != nil || !rec.Value.NotStarted || rec.Value.ChildID != childID {
		return store.Record[protocol.RunRecord]{}, false
	}
	return rec, true
}

// grantCoversQueued checks that grant g (the grant asked with, "" for
// the parent's credential, already checked) covers a run queued under
// parent: its child has no header yet, so the tree is the parent's. A
// grant outside it gets hidden's answer, as for a started run.
func (c *Coordinator) grantCoversQueued(ctx context.Context, g grantScope, grant, parent string, hidden func() error) error {
	if grant == "" || g.all {
		return nil
	}
	h, err := c.headers.get(ctx, c.st, parent)
	if errors.Is(err, store.ErrNotFound) {
		return hidden()
	}
	if err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "read the header of %s: %w", parent, err)
	}
	if ok, err := g.covers(ctx, c, h); err != nil || !ok {
		if err != nil {
			return err
		}
		return hidden()
	}
	return nil
}

func status(rec protocol.RunRecord) protocol.RunStatus {
	return protocol.RunStatus{RunID: rec.RunID, ChildID: rec.ChildID, State: rec.State, Result: rec.Result}
}

// runsAwait answers a run's status from brood_runs, waiting up to waitMs
// (capped by RunAwaitWaitMax) for it to settle.
func (c *Coordinator) runsAwait(ctx context.Context, req rpc.Request, ref protocol.RunRef) (protocol.RunStatus, error) {
	rec, err := c.loadRun(ctx, ref)
	if err != nil {
		return protocol.RunStatus{}, err
	}
	if rec.Value.State == protocol.RunSettled || ref.WaitMs <= 0 {
		return status(rec.Value), nil
	}
	wait := c.cfg.RunAwaitWaitMax
	if ref.WaitMs < wait.Milliseconds() {
		wait = time.Duration(ref.WaitMs) * time.Millisecond
	}
	if rec.Value.State == protocol.RunQueued {
		return c.waitQueued(ctx, rec.Value, wait)
	}
	return c.waitSettled(ctx, ref.RunID, wait)
}

// queuedPollInterval is how often runs.await of a queued run looks whether
// its record was written (the run admitted).
const queuedPollInterval = 250 * time.Millisecond

// waitQueued waits up to d for queued run q to be admitted (its record
// written), then for it to settle within what is left of d; still queued,
// it answers state queued.
func (c *Coordinator) waitQueued(ctx context.Context, q protocol.RunRecord, d time.Duration) (protocol.RunStatus, error) {
	deadline := time.Now().Add(d)
	for {
		if _, err := c.st.RunLatest(ctx, q.RunID); err == nil {
			return c.waitSettled(ctx, q.RunID, max(time.Until(deadline), 0))
		}
		if _, ok, _ := c.queuedRun(ctx, q.ParentSession, q.RunID); !ok {
			// Removed from the queue without a record: read it once more
			// (its record is written before its entry is removed).
			if _, err := c.st.RunLatest(ctx, q.RunID); err == nil {
				return c.waitSettled(ctx, q.RunID, max(time.Until(deadline), 0))
			}
			return protocol.RunStatus{}, protocol.Errorf(protocol.CodeUnavailable, "queued run %s left its queue without a record; retry", q.RunID)
		}
		wait := min(queuedPollInterval, time.Until(deadline))
		if wait <= 0 {
			return status(q), nil
		}
		select {
		case <-ctx.Done():
			return status(q), nil
		case <-time.After(wait):
		}
	}
}

// waitSettled watches a run record until it is settled or d passed, and
// returns its latest status.
func (c *Coordinator) waitSettled(ctx context.Context, runID string, d time.Duration) (protocol.RunStatus, error) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	// The state is watched under the provider its spec names, and joined
	// with the spec (store.JoinRun): only coordinators write specs.
	spec, err := c.st.RunSpec(wctx, runID)
	if err != nil {
		return protocol.RunStatus{}, protocol.Errorf(protocol.CodeUnavailable, "read run %s: %w", runID, err)
	}
	w, err := c.st.WatchRunState(wctx, spec.Provider, runID)
	if err != nil {
		return protocol.RunStatus{}, protocol.Errorf(protocol.CodeUnavailable, "watch run %s: %w", runID, err)
	}
	defer w.Stop()
	var last protocol.RunRecord
	for {
		select {
		case <-wctx.Done():
			if last.RunID == "" {
				r, err := c.st.Run(context.WithoutCancel(ctx), runID)
				if err != nil {
					return protocol.RunStatus{}, protocol.Errorf(protocol.CodeUnavailable, "read run %s: %w", runID, err)
				}
				last = r.Value
			}
			return status(last), nil
		case e, ok := <-w.Updates():
			if !ok {
				return status(last), nil
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			rec, err := store.Decode[protocol.RunRecord](e)
			if err != nil {
				continue
			}
			rec = store.JoinRun(spec, rec)
			last = rec
			if rec.State == protocol.RunSettled {
				return status(rec), nil
			}
		}
	}
}

// runsDispose reaches the process hosting the run on its host subject; the
// host settles `aborted` with the partial output. Idempotent: a settled run
// answers with its result.
func (c *Coordinator) runsDispose(ctx context.Context, req rpc.Request, ref protocol.RunRef) (protocol.RunStatus, error) {
	rec, err := c.loadRun(ctx, ref)
	if err != nil {
		return protocol.RunStatus{}, err
	}
	if rec.Value.State == protocol.RunSettled {
		return status(rec.Value), nil
	}
	if rec.Value.State == protocol.RunQueued {
		return c.disposeQueued(ctx, rec.Value)
	}
	if rec.Value.Mode == protocol.ModeContinuable {
		return protocol.RunStatus{}, protocol.Errorf(protocol.CodeInvalidArgument,
			"run %s is an epoch of continuable child %s: stop its turn with continuable.interrupt or end it with continuable.drain", rec.Value.RunID, rec.Value.ChildID)
	}
	return c.disposeRun(ctx, rec.Value, protocol.CauseDisposed)
}

// disposeWait bounds how long a dispose waits for the run to settle when its
// host cannot answer (a dead host is settled HOST_LOST within the expiry).
func (c *Coordinator) disposeWait() time.Duration {
	return protocol.HostDisposeWaitMax + c.cfg.HostExpiry
}

// disposeRun asks the run's host to dispose it and returns its settled status.
func (c *Coordinator) disposeRun(ctx context.Context, rec protocol.RunRecord, cause string) (protocol.RunStatus, error) {
	lease, err := c.st.Lease(ctx, rec.ChildID)
	if err == nil && lease.Value.RunID == rec.RunID && lease.Value.TakenOverBy == "" && c.reg.HostLive(lease.Value.HostID) {
		hctx, cancel := context.WithTimeout(ctx, hostDisposeTimeout)
		var st protocol.RunStatus
		herr := c.callHost(hctx, lease.Value.HostID, c.subj.Host(lease.Value.HostID, protocol.OpHostDispose),
			protocol.HostRunRequest{RunID: rec.RunID, ChildID: rec.ChildID, Cause: cause}, &st)
		cancel()
		if herr == nil && st.State == protocol.RunSettled {
			// The answer says the run settled; what it settled as is read
			// from the run's records, not taken from the answer: every
			// host of the provider sees the host subjects of the others
			// and may answer first (issue 29, item 7; docs/security.md,
			// "What a compromised worker can do").
			if r, err := c.st.RunLatest(ctx, rec.RunID); err == nil && r.Value.State == protocol.RunSettled {
				return status(r.Value), nil
			}
		}
		if herr != nil && !errors.Is(herr, protocol.ErrNotFound) {
			c.log.Warn("host did not dispose the run", "run", rec.RunID, "host", lease.Value.HostID, "err", herr)
		}
	}
	return c.waitSettled(ctx, rec.RunID, c.disposeWait())
}

// prepare asks a live instance of a provider that inherits parent context
// for the child's creation spec: the length of the seed its header records.
// The request carries the parent's completed prefix, which this replica
// reads (the provider's workers read no other session's log).
func (c *Coordinator) prepare(ctx context.Context, provider string, parent protocol.SessionHeader, childID string) (int64, error) {
	completed, err := c.parentCompleted(ctx, parent)
	if err != nil {
		return 0, err
	}
	req := protocol.ProviderPrepareRequest{ParentSession: parent.ID, ChildID: childID, Provider: provider, ParentCompleted: completed}
	var reply protocol.ProviderPrepareReply
	if _, err := c.dispatch(ctx, provider, protocol.OpProviderPrepare, childID, func(deadline int64) any {
		req.Deadline = deadline
		return req
	}, &reply); err != nil {
		return 0, err
	}
	if reply.SeedLength < 0 {
		return 0, protocol.Errorf(protocol.CodeInternal, "provider %s answered a negative seed length", provider)
	}
	return reply.SeedLength, nil
}
