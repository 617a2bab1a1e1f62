package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Stale requests and the claim (docs/design.md §14: work whose requester gave up
// is dropped without writing anything).
//
// A start or an activation carries the coordinator's deadline, and the run
// record the coordinator created for it with that record's revision. Before
// it writes or emits anything, the host
//
//  1. drops the request when its deadline passed (the coordinator stopped
//     waiting: it may have given the run to another instance, or settled it
//     as never started), and
//  2. claims the run: a compare-and-set of the run record, at the revision
//     the coordinator created it at, to the same record naming this host.
//
// Exactly one party changes a record at a revision, so at most one host
// starts a run, and a coordinator that gave up on a run (settling it at that
// revision) fences out every host that would start it late: the claim fails
// with NOT_PENDING and the host drops the request. From the claim on, the
// run is this host's: a failure later settles it (never started) itself.

// ClaimBudgetMax bounds the claim of a request whose deadline (by this host's
// clock) is further away than that.
const ClaimBudgetMax = 30 * time.Second

// withDeadline bounds ctx by a request's deadline (epoch ms), or returns
// UNAVAILABLE when the deadline already passed: the requester stopped
// waiting (or this host's clock is ahead of it), and nothing is done.
func (h *Host) withDeadline(ctx context.Context, deadlineMs int64, what, id string) (context.Context, context.CancelFunc, error) {
	if deadlineMs <= 0 {
		c, cancel := context.WithTimeout(ctx, ClaimBudgetMax)
		return c, cancel, nil
	}
	left := time.Until(time.UnixMilli(deadlineMs))
	if left <= 0 {
		h.log.Warn("dropping a request that arrived after its deadline (was this process paused? are clocks in sync?)",
			"op", what, "id", id, "late", (-left).String())
		return nil, nil, protocol.Errorf(protocol.CodeUnavailable, "host %s received the %s of %s %s after its deadline and dropped it",
			h.id, what, id, (-left).Round(time.Millisecond))
	}
	// Answer (UNAVAILABLE, when the claim cannot be written in time) before
	// the coordinator stops waiting for this attempt: a timeout is what
	// tells it an instance is paused (dispatch.go in the coordinator).
	c, cancel := context.WithTimeout(ctx, min(max(left-protocol.ReplyMargin(left), left/2), ClaimBudgetMax))
	return c, cancel, nil
}

// claim fences a start or an activation (see above): it writes run, which
// must be the record the coordinator created at rev, back with this host's
// id, and returns the claimed record and its revision. NOT_PENDING: another
// party changed the record first; UNAVAILABLE: JetStream did not take the
// write within ctx's deadline. Nothing else is written either way.
func (h *Host) claim(ctx context.Context, run protocol.RunRecord, rev uint64, childID string) (protocol.RunRecord, uint64, error) {
	if run.ChildID != childID || run.State != protocol.RunRunning || rev == 0 {
		return run, 0, protocol.Errorf(protocol.CodeInvalidArgument, "run must be the running record of child %s at its revision", childID)
	}
	run, nrev, err := h.st.ClaimRun(ctx, run, rev, h.id)
	switch {
	case errors.Is(err, store.ErrConflict):
		return run, 0, protocol.NewError(protocol.CodeNotPending, map[string]any{
			"runId": run.RunID, "reason": "its record changed since the coordinator created it (another instance started it, or it was settled)"})
	case err != nil:
		return run, 0, fmt.Errorf("%w: %w", errClaimUnknown, protocol.Errorf(protocol.CodeUnavailable, "claim run %s: %w", run.RunID, err))
	}
	return run, nrev, nil
}

// errClaimUnknown marks a claim whose write ran out of budget with its
// outcome unknown (an attempt's answer lost in a leader election, say): it
// may have landed. The caller answers UNAVAILABLE and resolves it with
// claimLanded.
var errClaimUnknown = errors.New("the claim's outcome is unknown")

// claimLanded decides, within SettleBudget, the outcome of a claim by this
// host that ran out of time unanswered (errClaimUnknown): claimed is the
// record the claim wrote at rev, the revision the coordinator created it at.
// It writes the same claim again by compare-and-set at rev
// (store.ReclaimRun): when either write landed, the run is this host's
// (nobody else starts or settles it, and the coordinator reports it
// started) and claimLanded reports the record and its revision, for the
// caller to carry it out; when another party changed the record first (the
// coordinator settled it, or gave it to another instance), the earlier write
// can no longer land and the run is left to that party. A read-back alone
// does not decide: the earlier write may still be in flight, read as absent
// and land afterwards, leaving a run claimed by a live host that forgot it
// (no lease, no log, no settlement: the coordinator settles orphaned
// records of dead claimers only).
func (h *Host) claimLanded(claimed protocol.RunRecord, rev uint64, cause error) (protocol.RunRecord, uint64, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), SettleBudget)
	defer cancel()
	nrev, err := h.st.ReclaimRun(ctx, claimed, rev)
	switch {
	case errors.Is(err, store.ErrConflict):
		h.log.Info("a claim whose answer was lost did not land: the record changed first; leaving the run to that party", "run", claimed.RunID, "cause", cause)
	case err != nil:
		h.log.Error("could not decide a claim whose outcome is unknown; if it landed, the run stays running until this host goes away",
			"run", claimed.RunID, "err", err, "cause", cause)
	default:
		h.log.Warn("a claim whose answer was lost is this host's; carrying out the run", "run", claimed.RunID)
		return claimed, nrev, true
	}
	return claimed, 0, false
}

// resolveClaim is claimLanded for a caller that carries out a landed claim in
// landed.
func (h *Host) resolveClaim(claimed protocol.RunRecord, rev uint64, cause error, landed func(protocol.RunRecord, uint64)) {
	if cur, nrev, ok := h.claimLanded(claimed, rev, cause); ok {
		landed(cur, nrev)
	}
}

// SettleBudget bounds the settlement of a run or epoch through transient
// JetStream failures: the store's (store.SettleBudget), named here too for
// the host's retries.
const SettleBudget = store.SettleBudget

// RunWriteBudget bounds the writes that decide whether a run or epoch this
// host claimed starts: a seeded child's seed, the session's lease, an
// epoch's claim's hold and, for an epoch, the read of its log and its first
// records (a one-shot run's first turn is an append of its session, which
// agent.Limits.AppendTimeout bounds, by default as long). A failure of any
// of them settles the run never started, DURABILITY_FAILED: with the
// store's WriteBudget (10 s) a leader election of BROOD_LOG, brood_agents
// or brood_runs that took longer on a loaded cluster did that to runs that
// only had to wait (deploy TestLeaderElectionsAreNotFailures, issue 9). A
// claimed run is this host's until it settles, so these writes wait out an
// election as long as its settlement would (store.SettleBudget, 60 s);
// nobody else waits on them (the coordinator's attempt ended with the
// claim), and a host cut off for longer than its expiry is taken over, its
// late writes refused by the lease's and the hold's compare-and-set and the
// log's expected sequence.
const RunWriteBudget = store.SettleBudget

// runWrites returns ctx (not its cancellation) bounded by RunWriteBudget,
// for the writes that start a claimed run or epoch.
func runWrites(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), RunWriteBudget)
}

// settleRecord settles a claimed run record by CAS at rev within
// store.SettleBudget. It reports whether this host won; false with a nil
// error when another party settled first.
func (h *Host) settleRecord(rec protocol.RunRecord, rev uint64) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), store.SettleBudget)
	defer cancel()
	return h.st.SettleRun(ctx, rec, rev)
}

// settle settles rec at rev and, if this host won, calls won (which
// publishes). When store.SettleBudget runs out (JetStream took no write for that
// long), the settlement waits in h.unsettled and is tried again after each
// heartbeat JetStream acknowledges, so no record this host owns stays
// running once JetStream is back; meanwhile its lease stays held.
func (h *Host) settle(rec protocol.RunRecord, rev uint64, won func()) {
	ok, err := h.settleRecord(rec, rev)
	switch {
	case err != nil:
		h.log.Error("could not settle; retrying after each heartbeat JetStream takes", "run", rec.RunID, "err", err)
		h.unsettled.add(rec.RunID, func(ctx context.Context) bool {
			ok, err := h.st.SettleRun(ctx, rec, rev)
			if err != nil {
				return false
			}
			if ok {
				won()
			} else {
				h.log.Info("settled by another party meanwhile; dropping this result", "run", rec.RunID)
			}
			return true
		})
	case ok:
		won()
	default:
		h.log.Info("already settled by another party; dropping this result", "run", rec.RunID)
	}
}

// UnsettledMax bounds the settlements a host keeps retrying; beyond it the
// oldest is given up (its lease stays held; a coordinator settles it from the
// log when the host goes away).
const UnsettledMax = 10000

// unsettled holds settlements whose budget ran out, by run id.
type unsettled struct {
	mu      sync.Mutex
	pending map[string]func(ctx context.Context) bool
	order   []string
	busy    bool
}

func (u *unsettled) add(runID string, try func(ctx context.Context) bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.pending == nil {
		u.pending = map[string]func(ctx context.Context) bool{}
	}
	if len(u.order) >= UnsettledMax {
		delete(u.pending, u.order[0])
		u.order = u.order[1:]
	}
	u.pending[runID] = try
	u.order = append(u.order, runID)
}

// retry tries every waiting settlement once, in the background, unless a
// round is under way; the ones that landed (or lost) leave.
func (u *unsettled) retry(log *slog.Logger) {
	u.mu.Lock()
	if u.busy || len(u.order) == 0 {
		u.mu.Unlock()
		return
	}
	u.busy = true
	ids := append([]string(nil), u.order...)
	u.mu.Unlock()
	go func() {
		for _, id := range ids {
			u.mu.Lock()
			try := u.pending[id]
			u.mu.Unlock()
			if try == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), store.SettleBudget)
			done := try(ctx)
			cancel()
			if !done {
				break // JetStream refuses again: wait for the next heartbeat
			}
			log.Info("a settlement that had run out of budget landed", "run", id)
			u.mu.Lock()
			delete(u.pending, id)
			for i, o := range u.order {
				if o == id {
					u.order = append(u.order[:i], u.order[i+1:]...)
					break
				}
			}
			u.mu.Unlock()
		}
		u.mu.Lock()
		u.busy = false
		u.mu.Unlock()
	}()
}

// abandon settles a claimed run that never started (a failure after the
// claim, before the child was published): stop reason error with cause's
// code, no subagent/start and so no subagent/end; a one-shot run's notify
// subject hears the result (a coordinator publishes it: RequestRunNotice),
// since its coordinator may already have answered the start. It returns
// cause.
func (h *Host) abandon(run protocol.RunRecord, rev uint64, cause error) error {
	run = store.NotStarted(run, h.id, cause)
	h.settle(run, rev, func() { h.st.RequestRunNotice(run, h.eventErr) })
	return cause
}

// LeaseReleaseTimeout bounds the first attempt to release a lease; a release
// that does not land then is tried again after each heartbeat JetStream
// takes (with the settlements that ran out of budget).
const LeaseReleaseTimeout = 5 * time.Second

// releaseLease deletes this host's lease on childID, a child of provider, at rev. A lease left
// behind by a live host is never taken over, and it keeps the session from
// being resumed: its pending messages would wait for good (chaos seed 1 of
// make test: a release cut off while JetStream elected a leader). So a
// release that fails for any reason but a changed or missing lease waits in
// h.unsettled and is tried again after each heartbeat JetStream takes.
func (h *Host) releaseLease(provider, childID string, rev uint64) {
	h.releaseLeaseAfter(provider, childID, rev, nil)
}

// releaseLeaseAfter is releaseLease with a step that must land first (nil:
// none), tried again with the release until it does: while it has not, the
// lease stays held.
func (h *Host) releaseLeaseAfter(provider, childID string, rev uint64, first func(context.Context) error) {
	h.releaseUntilDone(provider, childID, func(ctx context.Context) bool {
		if first != nil {
			if err := first(ctx); err != nil {
				return false
			}
		}
		err := h.st.ReleaseChildLease(ctx, provider, childID, rev)
		return err == nil || errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound)
	})
}

// dropUnknownLease removes lease, which this host wrote without learning
// the outcome (every answer within the create's budget lost) and gave up
// with its run or epoch: the create may have landed unseen, or land later
// (chaos short seed 1, RELIABILITY.md open finding 2: a worker cut off from
// its server while it took a resumed epoch's lease settled the epoch never
// started, DURABILITY_FAILED, and the lease landed anyway; held by a live
// host, it was never taken over, and the child's messages waited for
// good). The outcome is decided by writing the same lease again
// (store.Create reads a key holding this very value as its own write): the
// lease, landed now or before, is then deleted at its revision; another
// lease there (store.ErrConflict) is not this host's to delete. An attempt
// of the first create still in flight when its budget ran out could land
// after that deletion (a create succeeds over a deleted key), so a
// deletion decides it only the second time, after a later heartbeat
// JetStream took. Tried at once, then after each such heartbeat, as a
// release.
func (h *Host) dropUnknownLease(lease protocol.AgentRecord) {
	var deleted atomic.Int32
	h.releaseUntilDone(lease.Provider, lease.SessionID, func(ctx context.Context) bool {
		rev, err := h.st.CreateLease(ctx, lease)
		switch {
		case errors.Is(err, store.ErrConflict):
			return true
		case err != nil:
			return false
		}
		err = h.st.ReleaseChildLease(ctx, lease.Provider, lease.SessionID, rev)
		if err != nil && !errors.Is(err, store.ErrConflict) && !errors.Is(err, store.ErrNotFound) {
			return false
		}
		return deleted.Add(1) >= 2
	})
}

// releaseUntilDone runs try (a lease's removal; true once it is decided)
// within LeaseReleaseTimeout, and, when it is not decided then, again after
// each heartbeat JetStream takes (h.unsettled): a lease left behind by a
// live host is never taken over.
func (h *Host) releaseUntilDone(provider, childID string, try func(context.Context) bool) {
	ctx, cancel := context.WithTimeout(context.Background(), LeaseReleaseTimeout)
	defer cancel()
	if try(ctx) {
		return
	}
	h.log.Warn("the lease's release is not decided; trying again after each heartbeat JetStream takes", "session", childID)
	h.unsettled.add(store.LeaseKey(provider, childID), try)
}
