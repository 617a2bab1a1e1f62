package coordinator

// Budgets (docs/protocol.md §5.5, "Budgets"; issue 32, item 2): each budget
// is one ledger, brood_agents budget.<sessionId> (protocol.BudgetRecord),
// written only by coordinators, always by compare-and-set at the revision
// read from the bucket's leader. A session's header lists the ledgers it
// draws on, root-most first (protocol.SessionHeader.Budgets).
//
// Who writes what, in order:
//   - a start (runs.start, continuable.start) whose parent draws on budgets
//     charges one child to each of them once its live-children slot is
//     taken (budgetCharge), and gives it back if the start then fails;
//     a start that names a budget creates its ledger (createBudget) before
//     the child's header, and the header lists it after its parent's;
//   - agents.open with a budget creates the root's ledger before its header;
//   - budget.reserve, called by a worker with the session's own credential
//     before a model request or a step's tool calls, adds one reservation
//     to every ledger of the session's header, nearest last; a ledger that
//     cannot grant it refuses BUDGET_EXHAUSTED and the reservations already
//     added are removed. A token want may be granted in part: at least
//     tokensMin, at most what the tightest ledger has left (every ledger
//     then holds the same grant);
//   - budget.settle removes the reservation from every ledger and charges
//     what was used, once: a reservation already gone (settled, or charged
//     as below) is skipped;
//   - a reservation whose run has settled while it is still on a ledger
//     (its host died, its settlement was lost) is charged in full and
//     removed by the coordinator that settles the run as HOST_LOST
//     (budgetSweepRun), or else by the next coordinator that finds the
//     ledger short settledReservationGrace or more after the run settled
//     (sweepSettled; within it, a one-shot's last settlement may still be
//     on its way, and charges what was used). Removal is a
//     compare-and-set, so it is charged exactly once.

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// budgetAttemptsMax bounds the compare-and-set attempts of one ledger
// update; past it the update is UNAVAILABLE. Each attempt reads the
// ledger from the leader again, after a short random wait.
const budgetAttemptsMax = 64

// budgetUpdate reads ledger id (as this replica last wrote it, else from
// the bucket's leader) and applies f to it: f changes rec in place and says
// whether to write it, and returns the answer's error. A write that
// conflicts, or a decision not to write taken on a remembered ledger, runs
// f again on a fresh read from the leader.
func (c *Coordinator) budgetUpdate(ctx context.Context, id string, f func(rec *protocol.BudgetRecord, now int64) (bool, error)) error {
	_, err := c.budgetWrite(ctx, id, f)
	return err
}

// budgetWrite is budgetUpdate that also returns the revision it wrote (0:
// it wrote nothing).
func (c *Coordinator) budgetWrite(ctx context.Context, id string, f func(rec *protocol.BudgetRecord, now int64) (bool, error)) (uint64, error) {
	for attempt := 0; attempt < budgetAttemptsMax; attempt++ {
		got, known := c.ledgers.get(id)
		if !known {
			var err error
			if got, err = c.st.Budget(ctx, id); err != nil {
				if errors.Is(err, store.ErrNotFound) {
					return 0, protocol.Errorf(protocol.CodeInternal, "the ledger of budget %s is missing", id)
				}
				return 0, protocol.Errorf(protocol.CodeUnavailable, "read the ledger of budget %s: %w", id, err)
			}
			c.ledgers.put(id, got)
		}
		rec := got.Value
		rec.Reservations = slices.Clone(rec.Reservations) // f changes rec; the cached one stays as read
		write, ferr := f(&rec, store.NowMs())
		if !write {
			if !known {
				return 0, ferr
			}
			// What was decided on a remembered ledger without writing (a
			// refusal, a reservation not found) is decided again on the
			// leader's: another replica may have written since.
			c.ledgers.drop(id)
			continue
		}
		rec.WriteID = ulid.Make().String()
		rev, err := c.st.WriteBudget(ctx, id, rec, got.Revision)
		if err == nil {
			c.ledgers.put(id, store.Record[protocol.BudgetRecord]{Value: rec, Revision: rev})
			return rev, ferr
		}
		c.ledgers.drop(id)
		if !errors.Is(err, store.ErrConflict) {
			return 0, protocol.Errorf(protocol.CodeUnavailable, "write the ledger of budget %s: %w", id, err)
		}
		if known {
			continue // the remembered revision was behind: read it now
		}
		wait := time.Duration(rand.Int63n(int64(2*time.Millisecond*time.Duration(min(attempt+1, 10))))) + time.Millisecond
		select {
		case <-ctx.Done():
			return 0, protocol.Errorf(protocol.CodeUnavailable, "update the ledger of budget %s: %w", id, ctx.Err())
		case <-time.After(wait):
		}
	}
	return 0, protocol.Errorf(protocol.CodeUnavailable, "the ledger of budget %s kept changing: %d compare-and-set attempts", id, budgetAttemptsMax)
}

// ledgerCache remembers the ledgers this replica last read or wrote, with
// their revisions, at most ledgerCacheMax (then it starts over): a
// compare-and-set at a remembered revision that another replica moved on
// conflicts and is retried on a fresh read, so the cache only saves the
// leader read of a ledger this replica keeps writing (issue 32's
// acceptance: a run with a budget within 10 % of one without).
type ledgerCache struct {
	mu sync.Mutex
	m  map[string]store.Record[protocol.BudgetRecord]
}

const ledgerCacheMax = 4096

func (l *ledgerCache) get(id string) (store.Record[protocol.BudgetRecord], bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.m[id]
	return r, ok
}

func (l *ledgerCache) put(id string, r store.Record[protocol.BudgetRecord]) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil || len(l.m) >= ledgerCacheMax {
		l.m = map[string]store.Record[protocol.BudgetRecord]{}
	}
	l.m[id] = r
}

func (l *ledgerCache) drop(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, id)
}

// createBudget creates the ledger of the budget session id names.
func (c *Coordinator) createBudget(ctx context.Context, id string, b protocol.Budget, now int64, first ...protocol.BudgetReservation) error {
	rec := protocol.BudgetRecord{SessionID: id, Limits: b, CreatedAt: now, Reservations: first}
	if b.DeadlineMs > 0 {
		rec.DeadlineAt = now + b.DeadlineMs
	}
	rev, err := c.st.WriteBudget(ctx, id, rec, 0)
	switch {
	case errors.Is(err, store.ErrConflict):
		// A retried start of a reserved child id found the ledger its
		// first attempt created; DUPLICATE_CHILD follows.
		return nil
	case err != nil:
		return protocol.Errorf(protocol.CodeUnavailable, "create the ledger of budget %s: %w", id, err)
	}
	c.ledgers.put(id, store.Record[protocol.BudgetRecord]{Value: rec, Revision: rev})
	c.armDeadline(id, rec.DeadlineAt)
	return nil
}

// budgetRecords reads the ledgers of chain from the leader.
func (c *Coordinator) budgetRecords(ctx context.Context, chain []string) ([]protocol.BudgetRecord, error) {
	recs := make([]protocol.BudgetRecord, 0, len(chain))
	for _, id := range chain {
		got, err := c.st.Budget(ctx, id)
		if err != nil {
			return nil, protocol.Errorf(protocol.CodeUnavailable, "read the ledger of budget %s: %w", id, err)
		}
		recs = append(recs, got.Value)
	}
	return recs, nil
}

// checkChildBudget checks a start's budget b (nil: none) against what remains of the
// budgets its parent draws on (header): INVALID_ARGUMENT for a malformed
// one (checked before, protocol.Budget.Validate), LIMIT_EXCEEDED for one
// above a remainder. Nothing is written.
func (c *Coordinator) checkChildBudget(ctx context.Context, pheader protocol.SessionHeader, b *protocol.Budget) error {
	if b == nil {
		return nil
	}
	if err := b.Validate(); err != nil {
		return err
	}
	if len(pheader.Budgets) == 0 {
		return nil
	}
	recs, err := c.budgetRecords(ctx, pheader.Budgets)
	if err != nil {
		return err
	}
	rem, deadline := protocol.BudgetRemainder(recs)
	return b.WithinRemainder(rem, deadline, store.NowMs())
}

// createOwnBudget creates the ledger of a new child whose start named a
// budget (a.budget), at its header's creation time now; nothing otherwise.
// A header with BudgetStartTokens gets its first model request's
// reservation in the same write (id the child's, run runID).
func (c *Coordinator) createOwnBudget(ctx context.Context, a admission, h protocol.SessionHeader, runID string) error {
	if a.budget == nil {
		return nil
	}
	var first []protocol.BudgetReservation
	if h.BudgetStartTokens > 0 {
		first = []protocol.BudgetReservation{{ID: h.ID, SessionID: h.ID, RunID: runID,
			Spend: protocol.BudgetSpend{Tokens: h.BudgetStartTokens, ModelRequests: 1}, At: h.CreatedAt}}
	}
	return c.createBudget(ctx, h.ID, *a.budget, h.CreatedAt, first...)
}

// childBudgets is a new child's header budgets: its parent's ledgers, and
// its own last when its start named one; and the earliest deadline.
func childBudgets(pheader protocol.SessionHeader, own *protocol.Budget, childID string, now int64) ([]string, int64) {
	chain := slices.Clone(pheader.Budgets)
	deadline := pheader.BudgetDeadlineAt
	if own != nil {
		chain = append(chain, childID)
		if own.DeadlineMs > 0 && (deadline == 0 || now+own.DeadlineMs < deadline) {
			deadline = now + own.DeadlineMs
		}
	}
	return chain, deadline
}

// admitBudget charges a new child's start to the budgets its parent draws
// on. It returns what gives the charge back when the start then fails.
// (The child's own ledger, when its start named a budget, is created with
// its header: createRun, writeContinuableChild.)
func (c *Coordinator) admitBudget(ctx context.Context, a admission, childID string) (func(), error) {
	one := protocol.BudgetSpend{Children: 1}
	if err := c.budgetCharge(ctx, a.pheader.Budgets, one); err != nil {
		return nil, err
	}
	refund := func() {
		if len(a.pheader.Budgets) == 0 {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), store.SettleBudget)
		defer cancel()
		if err := c.budgetRefund(rctx, a.pheader.Budgets, one); err != nil {
			c.log.Warn("a failed start's child was not given back to its budgets", "child", childID, "err", err)
		}
	}
	return refund, nil
}

// budgetCharge charges spend (children: counts, never tokens) to every
// ledger of chain, or to none: a ledger that cannot take it refuses
// BUDGET_EXHAUSTED and the ledgers charged before it are given it back.
func (c *Coordinator) budgetCharge(ctx context.Context, chain []string, spend protocol.BudgetSpend) error {
	for i, id := range chain {
		err := c.budgetUpdate(ctx, id, func(rec *protocol.BudgetRecord, now int64) (bool, error) {
			if err := rec.Exhausted(spend, 0, now); err != nil {
				swept := c.sweepSettled(ctx, rec, now)
				if err = rec.Exhausted(spend, 0, now); err != nil {
					return swept, err
				}
			}
			rec.Charged = rec.Charged.Add(spend)
			return true, nil
		})
		if err != nil {
			if rerr := c.budgetRefund(context.WithoutCancel(ctx), chain[:i], spend); rerr != nil {
				c.log.Warn("a refused charge was not given back to every budget", "err", rerr)
			}
			return err
		}
	}
	return nil
}

// budgetRefund gives spend back to every ledger of chain (never below 0).
func (c *Coordinator) budgetRefund(ctx context.Context, chain []string, spend protocol.BudgetSpend) error {
	var first error
	for _, id := range chain {
		err := c.budgetUpdate(ctx, id, func(rec *protocol.BudgetRecord, _ int64) (bool, error) {
			ch := rec.Charged
			rec.Charged = protocol.BudgetSpend{
				Tokens: max(ch.Tokens-spend.Tokens, 0), ModelRequests: max(ch.ModelRequests-spend.ModelRequests, 0),
				ToolCalls: max(ch.ToolCalls-spend.ToolCalls, 0), Children: max(ch.Children-spend.Children, 0),
			}
			return true, nil
		})
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// settledReservationGrace is how long after its run settled (the run
// record's settledAt, against this coordinator's clock) a reservation
// still on a ledger is left to its settlement: a one-shot host settles and
// publishes its run while the last step's settlement is in flight
// (agent.Agent.OverlapSettles), and that settlement charges what the step
// used. Past it, sweepSettled charges the reservation in full.
const settledReservationGrace = 5 * time.Second

// sweepSettled charges in full, and removes, the reservations of rec whose
// run settled settledReservationGrace or more before now (epoch ms): its
// host died or its settlement never came, and the model request, tool call
// or child they stood for may have been spent. It reports whether it
// removed any. A run it cannot read is left.
func (c *Coordinator) sweepSettled(ctx context.Context, rec *protocol.BudgetRecord, now int64) bool {
	swept := false
	settled := map[string]bool{}
	rec.Reservations = slices.DeleteFunc(rec.Reservations, func(r protocol.BudgetReservation) bool {
		if r.RunID == "" {
			return false
		}
		done, ok := settled[r.RunID]
		if !ok {
			run, err := c.st.Run(ctx, r.RunID)
			done = err == nil && run.Value.State == protocol.RunSettled && settledLongAgo(run.Value, now)
			settled[r.RunID] = done
		}
		if done {
			rec.Charged = rec.Charged.Add(r.Spend)
			swept = true
		}
		return done
	})
	return swept
}

// othersHoldTokens reports whether a reservation of rec that holds tokens
// belongs to a session other than self: only then can a reservation that
// does not fit gain by asking again (budget.reserve's retryMs, §5.5 "The
// reservation rule"). The caller's own reservations are left out: its agent
// settles each before it reserves again (internal/agent, reserveModel), and
// one it still holds (a turn's prefetch) is not settled while it waits.
// Reservations of runs settled settledReservationGrace ago are gone
// (sweepSettled, before); those of runs settled more recently count, their
// settlements on their way.
func othersHoldTokens(rec *protocol.BudgetRecord, self string) bool {
	for _, r := range rec.Reservations {
		if r.Spend.Tokens > 0 && r.SessionID != self {
			return true
		}
	}
	return false
}

// settledLongAgo reports whether run settled settledReservationGrace or
// more before now (epoch ms); a record without its settledAt counts as
// long ago.
func settledLongAgo(run protocol.RunRecord, now int64) bool {
	return run.SettledAt == 0 || now-run.SettledAt >= settledReservationGrace.Milliseconds()
}

// budgetSweepRun charges in full, and removes, the reservations of run
// runID on the ledgers of chain: called by the coordinator that settled the
// run after its host died (its reservations can no longer be settled by
// it). A reservation already removed is not charged again.
func (c *Coordinator) budgetSweepRun(ctx context.Context, chain []string, runID string) {
	for _, id := range chain {
		err := c.budgetUpdate(ctx, id, func(rec *protocol.BudgetRecord, _ int64) (bool, error) {
			n := len(rec.Reservations)
			rec.Reservations = slices.DeleteFunc(rec.Reservations, func(r protocol.BudgetReservation) bool {
				if r.RunID == runID {
					rec.Charged = rec.Charged.Add(r.Spend)
					return true
				}
				return false
			})
			return len(rec.Reservations) != n, nil
		})
		if err != nil {
			c.log.Warn("a dead host's reservations were left on a budget; the next reservation that finds it short charges them", "budget", id, "run", runID, "err", err)
		}
	}
}

// sweepRunBudgets charges the reservations the dead host of session id's
// run runID left on its budgets (budgetSweepRun), once the run is settled.
func (c *Coordinator) sweepRunBudgets(ctx context.Context, id, runID string) {
	h, err := c.headers.get(ctx, c.st, id)
	if err != nil || len(h.Budgets) == 0 {
		return
	}
	c.budgetSweepRun(ctx, h.Budgets, runID)
}

// checkSpend refuses a reservation's or settlement's spend with a negative
// or huge field.
func checkSpend(name string, s protocol.BudgetSpend) error {
	for _, f := range []struct {
		n string
		v int64
	}{{"tokens", s.Tokens}, {"modelRequests", s.ModelRequests}, {"toolCalls", s.ToolCalls}, {"children", s.Children}} {
		if f.v < 0 || f.v > protocol.BudgetValueMax {
			return protocol.NewError(protocol.CodeInvalidArgument, map[string]any{"field": name + "." + f.n,
				"reason": fmt.Sprintf("%s.%s must be a whole number from 0 to 2^53−1, not %d", name, f.n, f.v)})
		}
	}
	return nil
}

// budgetReserve is budget.reserve: the session (its own credential, a live
// agent) reserves want on every budget its header lists. A session with no
// budget gets an empty reservation id and every want granted.
func (c *Coordinator) budgetReserve(ctx context.Context, _ rpc.Request, r protocol.BudgetReserveRequest) (protocol.BudgetReserveReply, error) {
	if err := checkSpend("want", r.Want); err != nil {
		return protocol.BudgetReserveReply{}, err
	}
	if r.Want.IsZero() || r.Want.Children != 0 {
		return protocol.BudgetReserveReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "want must name tokens, modelRequests or toolCalls (children are charged by the start itself)")
	}
	if r.TokensMin < 0 || r.TokensMin > r.Want.Tokens {
		return protocol.BudgetReserveReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "tokensMin must be from 0 to want.tokens, not %d", r.TokensMin)
	}
	l, err := c.authorize(ctx, r.Self)
	if err != nil {
		return protocol.BudgetReserveReply{}, err
	}
	h, err := c.headers.get(ctx, c.st, r.Self.SessionID)
	if err != nil {
		return protocol.BudgetReserveReply{}, protocol.Errorf(protocol.CodeUnavailable, "read the session's header: %w", err)
	}
	if len(h.Budgets) == 0 {
		return protocol.BudgetReserveReply{Granted: r.Want}, nil
	}
	res := protocol.BudgetReservation{
		ID: ulid.Make().String(), SessionID: h.ID, RunID: l.rec.RunID, HostID: l.rec.HostID,
		CredentialHash: l.rec.CredentialHash, Spend: r.Want, At: store.NowMs(),
	}
	var done []string
	retry := false
	for _, id := range h.Budgets {
		err := c.budgetUpdate(ctx, id, func(rec *protocol.BudgetRecord, now int64) (bool, error) {
			retry = false
			short := res.Spend.Tokens > rec.Remaining().Tokens
			swept := false
			if short || rec.Exhausted(res.Spend, r.TokensMin, now) != nil {
				swept = c.sweepSettled(ctx, rec, now)
				short = res.Spend.Tokens > rec.Remaining().Tokens
			}
			if short && !r.NoWait && !(rec.DeadlineAt > 0 && now >= rec.DeadlineAt) && othersHoldTokens(rec, h.ID) {
				// Tokens held by other sessions' reservations in flight
				// are estimates, mostly released when settled: ask again
				// rather than take less than the request wants. (The
				// sweep, first, wrote off those of runs settled long ago.)
				retry = true
				return swept, nil
			}
			if err := rec.Exhausted(res.Spend, r.TokensMin, now); err != nil {
				return swept, err
			}
			if len(rec.Reservations) >= protocol.BudgetReservationsMax {
				return false, protocol.Errorf(protocol.CodeUnavailable, "budget %s has %d reservations in flight, the most it holds; try again", id, protocol.BudgetReservationsMax)
			}
			if res.Spend.Tokens > 0 {
				res.Spend.Tokens = min(res.Spend.Tokens, rec.Remaining().Tokens)
			}
			rec.Reservations = append(rec.Reservations, res)
			return true, nil
		})
		if err != nil || retry {
			c.dropReservation(context.WithoutCancel(ctx), done, res.ID, nil)
			if retry {
				return protocol.BudgetReserveReply{RetryMs: protocol.BudgetRetryMs}, nil
			}
			return protocol.BudgetReserveReply{}, err
		}
		done = append(done, id)
	}
	// A ledger further on may have granted fewer tokens: the ones before
	// it hold the same grant.
	c.shrinkReservation(ctx, done, res)
	return protocol.BudgetReserveReply{ReservationID: res.ID, Granted: res.Spend}, nil
}

// shrinkReservation lowers the token grant of reservation res on the
// ledgers of chain to res's (a later ledger granted fewer).
func (c *Coordinator) shrinkReservation(ctx context.Context, chain []string, res protocol.BudgetReservation) {
	for _, id := range chain {
		err := c.budgetUpdate(ctx, id, func(rec *protocol.BudgetRecord, _ int64) (bool, error) {
			for i := range rec.Reservations {
				if x := &rec.Reservations[i]; x.ID == res.ID && x.Spend.Tokens > res.Spend.Tokens {
					x.Spend.Tokens = res.Spend.Tokens
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			c.log.Warn("a reservation holds more tokens than granted until it is settled", "budget", id, "err", err)
		}
	}
}

// dropReservation removes reservation id from the ledgers of chain,
// charging used (nil: nothing) to each ledger that still held it. It
// returns the first error; a ledger without it is skipped (settled or
// swept before: charged once).
func (c *Coordinator) dropReservation(ctx context.Context, chain []string, id string, used *protocol.BudgetSpend) error {
	var first error
	for _, b := range chain {
		err := c.budgetUpdate(ctx, b, func(rec *protocol.BudgetRecord, _ int64) (bool, error) {
			i := slices.IndexFunc(rec.Reservations, func(r protocol.BudgetReservation) bool { return r.ID == id })
			if i < 0 {
				return false, nil
			}
			rec.Reservations = slices.Delete(rec.Reservations, i, i+1)
			if used != nil {
				rec.Charged = rec.Charged.Add(*used)
			}
			return true, nil
		})
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// budgetSettle is budget.settle: the session settles its reservation,
// charging what it used and releasing the rest, on every budget its header
// lists. The credential must be the one that took the reservation (its
// lease may be ending: a step cut by a dispose still settles).
func (c *Coordinator) budgetSettle(ctx context.Context, _ rpc.Request, r protocol.BudgetSettleRequest) (protocol.Empty, error) {
	if err := checkSpend("used", r.Used); err != nil {
		return protocol.Empty{}, err
	}
	if !protocol.ValidID(r.Self.SessionID) || r.Self.Credential == "" || !protocol.ValidID(r.ReservationID) {
		return protocol.Empty{}, protocol.Errorf(protocol.CodeInvalidArgument, "self (sessionId and credential) and a reservationId are required")
	}
	h, err := c.headers.get(ctx, c.st, r.Self.SessionID)
	if err != nil {
		return protocol.Empty{}, notLiveCredential(r.Self.SessionID)
	}
	// The reservation's credential settles it; one taken at admission
	// (BudgetStartTokens: no credential existed yet) is settled by the
	// session's live agent.
	settler := func(x protocol.BudgetReservation) bool {
		if x.CredentialHash == "" {
			_, err := c.authorize(ctx, r.Self)
			return err == nil
		}
		return protocol.CredentialMatches(r.Self.Credential, x.CredentialHash)
	}
	for _, id := range h.Budgets {
		err := c.budgetUpdate(ctx, id, func(rec *protocol.BudgetRecord, _ int64) (bool, error) {
			i := slices.IndexFunc(rec.Reservations, func(x protocol.BudgetReservation) bool { return x.ID == r.ReservationID })
			if i < 0 {
				return false, nil // settled before, or charged in full: once
			}
			if x := rec.Reservations[i]; x.SessionID != h.ID || !settler(x) {
				return false, notLiveCredential(r.Self.SessionID)
			}
			rec.Reservations = slices.Delete(rec.Reservations, i, i+1)
			rec.Charged = rec.Charged.Add(r.Used)
			return true, nil
		})
		if err != nil {
			return protocol.Empty{}, err
		}
	}
	return protocol.Empty{}, nil
}
