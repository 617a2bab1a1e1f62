package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Budget deadlines (docs/protocol.md §5.5, "Budgets"; issue 32, item 3):
// a deadline that passes ends the subtree of the session whose budget
// named it as a dispose does, and the results say so. Each turn is cut at
// its header's budgetDeadlineAt by its own worker already; what no turn's
// clock ends — an idle continuable activation, an ACP child, a session
// whose worker's clock runs late — the coordinators end:
//
//   - the coordinator that creates a ledger with a deadline arms a timer
//     for it (at most DeadlineTimersMax at once; the sweep finds the rest);
//   - every BudgetDeadlineSweepInterval each coordinator takes up every
//     ledger its watch of brood_agents holds (at most
//     DeadlineSweepLedgersMax a sweep) whose deadline passed and whose
//     subtree was not ended yet, so a deadline outlives a coordinator's
//     restart: the ledger holds it;
//   - ending a subtree (endAtDeadline) disposes every live session under
//     the budget's session, and the session itself unless it is a root
//     (a root stands for its user, who is told by its children's ends),
//     child first, with cause deadline (protocol.CauseDeadline): a turn it
//     cuts ends `error` BUDGET_EXHAUSTED naming the deadline, an epoch it
//     ends settles so, a one-shot run settles so. Then the ledger is marked
//     (deadlineEndedAt, by compare-and-set) and no sweep takes it up again.
//
// Two coordinators that take up one deadline at once both dispose: a
// dispose of an ended session is a no-op, so the subtree ends once. A
// session started after the deadline is refused BUDGET_EXHAUSTED (the
// ledger's Exhausted), and a continuable one resumed later has its turn
// cut at once by its header's deadline.

// DefaultBudgetDeadlineSweepInterval is Config.BudgetDeadlineSweepInterval's default.
const DefaultBudgetDeadlineSweepInterval = 10 * time.Second

// DeadlineSweepLedgersMax bounds the ledgers one deadline sweep takes up;
// the rest wait for the next sweep.
const DeadlineSweepLedgersMax = 4096

// DeadlineTimersMax bounds the deadline timers one replica holds; a
// deadline past it is taken up by a sweep.
const DeadlineTimersMax = 4096

// deadlineEndTimeout bounds one subtree's end: the disposes (each bounded
// by hostDisposeTimeout or the run's settlement) and the ledger's mark.
const deadlineEndTimeout = 2 * time.Minute

// deadlines holds the replica's armed timers and the deadlines being
// taken up, so one replica takes up each once at a time.
type deadlines struct {
	mu     sync.Mutex
	timers map[string]*time.Timer
	busy   map[string]bool
}

// armDeadline arms a timer that takes up the deadline of budget id at at
// (epoch ms), off the reply path in the replica's lifetime (background);
// nothing when the replica holds DeadlineTimersMax timers already (a sweep
// takes it up).
func (c *Coordinator) armDeadline(id string, at int64) {
	if at <= 0 {
		return
	}
	d := &c.deadlines
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timers == nil {
		d.timers = map[string]*time.Timer{}
	}
	if _, ok := d.timers[id]; ok || len(d.timers) >= DeadlineTimersMax {
		return
	}
	d.timers[id] = time.AfterFunc(time.Until(time.UnixMilli(at)), func() {
		d.mu.Lock()
		delete(d.timers, id)
		d.mu.Unlock()
		c.background(func(ctx context.Context) { c.endAtDeadline(ctx, id) })
	})
}

// stopDeadlineTimers stops the armed timers (the replica stops; the sweeps
// of the others take their deadlines up).
func (c *Coordinator) stopDeadlineTimers() {
	d := &c.deadlines
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, t := range d.timers {
		t.Stop()
		delete(d.timers, id)
	}
}

// deadlineSweep runs a sweep every Config.BudgetDeadlineSweepInterval until
// ctx ends.
func (c *Coordinator) deadlineSweep(ctx context.Context) {
	defer c.stopDeadlineTimers()
	every := c.cfg.BudgetDeadlineSweepInterval
	if every <= 0 {
		every = DefaultBudgetDeadlineSweepInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.sweepDeadlines(ctx)
	}
}

// sweepDeadlines is one sweep: every ledger its replica's watch of
// brood_agents holds whose deadline passed with its subtree not ended (no
// listing of the bucket's keys: that is a consumer created per replica
// per sweep) is read again and taken up (endAtDeadline), one after
// another, at most DeadlineSweepLedgersMax.
func (c *Coordinator) sweepDeadlines(ctx context.Context) {
	for _, id := range c.agents.dueDeadlines(store.NowMs(), DeadlineSweepLedgersMax) {
		if ctx.Err() != nil {
			return
		}
		c.endAtDeadline(ctx, id)
	}
}

// deadlineDue reports whether rec's deadline passed at now and its
// subtree was not ended yet.
func deadlineDue(rec protocol.BudgetRecord, now int64) bool {
	return rec.DeadlineAt > 0 && now >= rec.DeadlineAt && rec.DeadlineEndedAt == 0
}

// endAtDeadline ends the subtree of budget id, whose deadline passed:
// every live session under its session, and that session unless it is a
// root, disposed child first with cause deadline; then the ledger is
// marked. A subtree some session of which did not stop is left unmarked
// for the next sweep.
func (c *Coordinator) endAtDeadline(ctx context.Context, id string) {
	d := &c.deadlines
	d.mu.Lock()
	if d.busy == nil {
		d.busy = map[string]bool{}
	}
	if d.busy[id] {
		d.mu.Unlock()
		return
	}
	d.busy[id] = true
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.busy, id)
		d.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(ctx, deadlineEndTimeout)
	defer cancel()
	rec, err := c.st.Budget(ctx, id)
	if err != nil || !deadlineDue(rec.Value, store.NowMs()) {
		return
	}
	reply, err := c.disposeSubtree(ctx, id, protocol.CauseDeadline)
	if err != nil {
		c.log.Warn("a budget's deadline passed and its subtree did not end; the next sweep tries again", "budget", id, "err", err)
		return
	}
	err = c.budgetUpdate(ctx, id, func(rec *protocol.BudgetRecord, now int64) (bool, error) {
		if rec.DeadlineEndedAt != 0 {
			return false, nil
		}
		rec.DeadlineEndedAt = now
		return true, nil
	})
	if err != nil {
		c.log.Warn("a budget's subtree ended at its deadline, the ledger was not marked; the next sweep ends it again", "budget", id, "err", err)
	}
	c.log.Info("a budget's deadline passed: its subtree was ended", "budget", id,
		"deadline", time.UnixMilli(rec.Value.DeadlineAt).UTC().Format(time.RFC3339Nano), "disposed", len(reply.Disposed))
}

// disposeSubtree disposes every live session under id, and id itself when
// it is no root, child first (the deepest level first, one level in
// parallel), with cause: a continuable activation's epoch is ended, a
// one-shot run is disposed and waited for until it settled (its own end
// then finds its descendants gone). ACTIVATION_TEARDOWN_FAILED when some
// did not stop (the others were disposed).
func (c *Coordinator) disposeSubtree(ctx context.Context, id, cause string) (protocol.DrainReply, error) {
	found, err := c.liveSubtree(ctx, id, func(protocol.AgentRecord) bool { return true })
	if err != nil {
		return protocol.DrainReply{}, err
	}
	switch own, err := c.st.Lease(ctx, id); {
	case err == nil:
		if own.Value.Kind != protocol.AgentRoot && c.leaseLive(own.Value) {
			found[id] = own.Value
		}
	case !errors.Is(err, store.ErrNotFound):
		return protocol.DrainReply{}, protocol.Errorf(protocol.CodeUnavailable, "read the lease of %s: %w", id, err)
	}
	reply := c.disposeLevels(ctx, found, func(ctx context.Context, rec protocol.AgentRecord) error {
		if rec.Kind == protocol.AgentContinuable {
			return c.disposeActivation(ctx, rec.HostID, rec.SessionID, cause)
		}
		run, err := c.st.Run(ctx, rec.RunID)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if run.Value.State == protocol.RunSettled {
			return nil
		}
		st, err := c.disposeRun(ctx, run.Value, cause)
		if err == nil && st.State != protocol.RunSettled {
			return fmt.Errorf("run %s is still %s", rec.RunID, st.State)
		}
		return err
	})
	if len(reply.Failed) > 0 {
		return reply, protocol.NewError(protocol.CodeActivationTeardownFailed, map[string]any{
			"reason": fmt.Sprintf("%d sessions under %s did not stop: %s", len(reply.Failed), id, strings.Join(reply.Failed, ", "))})
	}
	return reply, nil
}
