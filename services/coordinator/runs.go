package coordinator

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

func (c *Coordinator) childHeader(a admission, id string, now int64) protocol.SessionHeader {
	return protocol.SessionHeader{
		Version: protocol.SessionHeaderVersion, ID: id, CreatedAt: now, Cwd: a.pheader.Cwd,
		ParentSession: a.pheader.ID, Origin: protocol.OriginSubagent, DelegationDepth: a.depth,
		ToolCeiling: a.ceiling, DepthCap: a.depthCap, Provider: a.desc.Name,
		// The tree's user, for the worker's per-user workspace fence
		// (docs/security.md, "The workspace is fenced").
		User:        a.pheader.User,
		AutoApprove: a.autoApprove,
	}
}

func ptrTo[T any](v T) *T { return &v }

func ancestry(a admission) []string {
	return append(append([]string(nil), a.parent.rec.Ancestry...), a.pheader.ID)
}

// runsStart admits a one-shot run, writes the child's header and run record,
// asks a provider instance to publish the child, and answers {runId, childId}
// at publication (docs/design.md §7).
func (c *Coordinator) runsStart(ctx context.Context, req rpc.Request, r protocol.RunStartRequest) (protocol.RunStartReply, error) {
	began := time.Now()
	if err := c.checkNotify(req, r.Notify); err != nil {
		return protocol.RunStartReply{}, err
	}
	var err error
	if r.Options.Label, err = protocol.OneLabel(r.Label, r.Options.Label); err != nil {
		return protocol.RunStartReply{}, err
	}
	a, err := c.admit(ctx, r.Provider, r.Parent, r.Prompt, r.Options)
	if err != nil {
		return protocol.RunStartReply{}, err
	}
	childID := ulid.Make().String()
	runID := childID // local providers: the run id is the child's session id (seed: SubagentRun.id)
	if a.desc.Remote {
		runID = ulid.Make().String() // remote providers: a fresh id in the parent's namespace
	}
	if err := c.reserveAuthorized(ctx, r.Parent, a.pheader.ID, childID); err != nil {
		return protocol.RunStartReply{}, err
	}
	release := func() { c.releaseChild(ctx, a.pheader.ID, childID) }
	start, runRev, err := c.createRun(ctx, a, req, r, runID, childID)
	if err != nil {
		release()
		return protocol.RunStartReply{}, err
	}
	dctx, cancel := reserve(ctx)
	_, err = c.dispatch(dctx, a.desc.Name, protocol.OpProviderStart, runID, func(deadline int64) any {
		start.Deadline = deadline
		return start
	}, &protocol.ProviderStartReply{})
	cancel()
	unread := false
	if err != nil && (errors.Is(err, protocol.ErrNotPending) || c.failRun(ctx, start.Run, runRev, err)) {
		// An instance claimed the run (one whose answer we did not wait
		// for): it started the child, or settled it never started.
		unread, err = c.claimedRun(ctx, start.Run, runRev, err)
	}
	if err != nil {
		if !unread { // a run claimed and maybe live keeps its slot until it ends
			release()
		}
		return protocol.RunStartReply{}, err
	}
	c.cfg.Metrics.StartAnswered(start.Run.Provider, start.Run.Mode, time.Since(began))
	return protocol.RunStartReply{RunID: runID, ChildID: childID}, nil
}

// checkNotify checks a start's notify subject (validNotify): a caller's
// notices go to its own inbox prefix only, never another user's
// (docs/security.md): the deployment lets each user subscribe only under
// _INBOX.<user>.
func (c *Coordinator) checkNotify(req rpc.Request, notify string) error {
	if notify == "" {
		return nil
	}
	if !c.validNotify(notify) {
		return protocol.Errorf(protocol.CodeInvalidArgument,
			"notify must be a literal subject of printable ASCII without wildcards, outside %s.> and $-subjects (use your connection's inbox prefix)", c.subj.Prefix())
	}
	if user := c.callerOf(req); user != "" && !strings.HasPrefix(notify, protocol.UserInboxPrefix(user)+".") {
		return protocol.Errorf(protocol.CodeInvalidArgument,
			"notify %q must lie under your own inbox prefix %s. (connect as NATS user %s with that inbox prefix, as brood does)", notify, protocol.UserInboxPrefix(user), user)
	}
	return nil
}

// reserveAuthorized takes the live-children slot of childID under the
// session parentID (parent's, its header's id), whose credential is read from the bucket's leader before anything but
// the slot is written: this replica's cache, or a follower, may still hold
// the lease of a root closed a moment ago (chaos seed 3: a run started with
// a closed root's credential 0.4 s after the close, right after a partition
// healed, and its prompt reached the child's log: I4). The read and the
// slot's compare-and-set do not depend on each other, so they run together
// (issue 16: each may wait out an election of brood_agents, and back to
// back they cost a start two); a parent found not live gives the slot back,
// and its refusal is the answer.
func (c *Coordinator) reserveAuthorized(ctx context.Context, parent protocol.ParentRef, parentID, childID string) error {
	var authErr, slotErr error
	_ = parallel(ctx,
		func() error { _, authErr = c.authorizeFresh(ctx, parent); return authErr },
		func() error { slotErr = c.reserveChild(ctx, parentID, childID, ""); return slotErr },
	)
	switch {
	case authErr != nil:
		if slotErr == nil {
			c.releaseChild(ctx, parentID, childID)
		}
		return authErr
	case slotErr != nil:
		return slotErr
	}
	return nil
}

// createRun writes an admitted one-shot run's child header and run record
// and returns the provider start that publishes it, with the record's
// revision. The run and its child are created at the admission, once the
// slot is taken: a child whose settlement let this one in (read while the
// slot was being taken, which may wait for the parent's slot lock and read
// every counted child from the leader) settled before this time, so the
// records never show it live at this child's admission (RELIABILITY.md I8;
// chaos seeds 2 and 3 of issue 9, stamped 28 ms and 1.07 s before the
// slot). The ids are drawn before, as the slot names the child: their ULID
// time is not the admission.
func (c *Coordinator) createRun(ctx context.Context, a admission, req rpc.Request, r protocol.RunStartRequest, runID, childID string) (protocol.ProviderStartRequest, uint64, error) {
	now := store.NowMs()
	header := c.childHeader(a, childID, now)
	if a.desc.InheritsParentContext {
		seed, err := c.prepare(ctx, a.desc.Name, a.pheader, childID)
		if err != nil {
			return protocol.ProviderStartRequest{}, 0, err
		}
		header.SeedLength = seed
	}
	rec := protocol.RunRecord{
		RunID: runID, ChildID: childID, ParentSession: a.pheader.ID, Provider: a.desc.Name,
		Mode: protocol.ModeOneShot, Notify: r.Notify, NotifyJSON: req.Encoding == protocol.JSON, Structured: a.options.OutputSchema != "", Remote: a.desc.Remote,
		State: protocol.RunRunning, CreatedAt: now,
	}
	var runRev uint64
	if err := parallel(ctx,
		func() error { return c.st.PutHeader(ctx, header) },
		func() (err error) { runRev, err = c.st.CreateRun(ctx, rec); return err },
	); err != nil {
		return protocol.ProviderStartRequest{}, 0, protocol.Errorf(protocol.CodeUnavailable, "record the run: %w", err)
	}
	c.cfg.Metrics.RunStarted(rec.Provider, rec.Mode)
	c.st.PutChildIndexAsync(header.ParentSession, protocol.ChildIndexRecord{
		ChildID: childID, CreatedAt: now, Mode: protocol.ModeOneShot, Provider: a.desc.Name,
	}, func(err error) { c.log.Warn("child index entry not written", "child", childID, "err", err) })
	c.headers.add(header)
	return protocol.ProviderStartRequest{
		RunID: runID, Header: header, Provider: a.desc.Name, Prompt: r.Prompt, Notify: r.Notify, NotifyJSON: req.Encoding == protocol.JSON,
		Source: ptrTo(protocol.PromptSource(a.pheader)), RunRevision: protocol.Seq(runRev), Run: rec, Options: a.options, Ancestry: ancestry(a),
	}, runRev, nil
}

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
// child (docs/design.md §7, Settlement 4). Authority comes first: a caller that
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
	rec, err := c.st.Run(ctx, ref.RunID)
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
			return rec, hidden()
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
	return c.waitSettled(ctx, ref.RunID, wait)
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
	w, err := c.st.Runs.Watch(wctx, store.RunStateKey(spec.Provider, runID))
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
	if err == nil && lease.Value.RunID == rec.RunID && lease.Value.TakenOverBy == "" && c.reg.hostLive(lease.Value.HostID) {
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
