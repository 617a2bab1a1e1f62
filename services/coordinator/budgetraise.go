package coordinator

// Pause and raise (docs/protocol.md §5.5, "Pause and raise"; issue 32,
// item 3). A continuable child at its budget's cap parks its turn on a
// request of kind budget (requests.open, as an approval is); budget.raise
// raises its own ledger and answers that request approved, which wakes the
// turn as an approval does (wakeParked). The order of writes of a raise:
//
//  1. the child's ledger budget.<childId>, by compare-and-set
//     (budgetWrite), the raised limits checked against the raiser's
//     remainder inside the write, its raise count (raises) one more;
//  2. each pending budget request of the child, or of a session paused on
//     that ledger, moved pending → approved by compare-and-set (an answer
//     that landed first stands): found in the watch of brood_agents
//     (agentIndex.pausesOn, no listing), once the watch applied the
//     ledger write of step 1;
//  3. the wake of each such session no activation holds (wakeParked).
//
// A raise that lands between a child's refused reservation and its
// request's opening (milliseconds) is not lost: the refusal names the
// ledger's raise count, the pause repeats it when it opens its request
// (budgetRaises), and requests.open, once the request exists, reads the
// ledger and answers it approved at once when the count grew
// (answerRaisedMeanwhile). Either the raise's ledger write came before
// that read, which sees it, or after it, so after the request was
// written: the watch applies the bucket's revisions in order, so once it
// applied the ledger write, step 2 finds the request.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// budgetGet is budget.get: the ledgers a child draws on, for its exact
// live parent or a user grant over its tree (continuable.state's rule).
func (c *Coordinator) budgetGet(ctx context.Context, _ rpc.Request, r protocol.BudgetGetRequest) (protocol.BudgetGetReply, error) {
	h, _, err := c.budgetTarget(ctx, r.ChildID, r.Authority)
	if err != nil {
		if notAChild(err) {
			// A child whose start waits in its parent's queue has no
			// session yet: it will draw on its parent's ledgers, and on
			// its own once it starts (startqueue.go).
			if e, ok := c.queuedChild(ctx, r.ChildID, r.Authority); ok {
				return c.queuedBudgets(ctx, r.ChildID, r.Authority, e)
			}
		}
		return protocol.BudgetGetReply{}, err
	}
	recs, err := c.budgetRecords(ctx, h.Budgets)
	if err != nil {
		return protocol.BudgetGetReply{}, err
	}
	for i := range recs {
		recs[i] = shownLedger(recs[i], h.ID)
	}
	return protocol.BudgetGetReply{ChildID: h.ID, Budgets: recs, Own: slices.Contains(h.Budgets, h.ID)}, nil
}

// queuedBudgets is budget.get's answer for continuable child childID whose
// start e waits in its parent's queue (queuedChild found it, asked with
// auth): its parent's ledgers, then the budget e names as a ledger not yet
// created (Own), Queued set.
func (c *Coordinator) queuedBudgets(ctx context.Context, childID string, auth protocol.Authority, e protocol.QueuedStart) (protocol.BudgetGetReply, error) {
	parent := c.agents.queuedParentOf(childID)
	if auth.Parent != nil {
		parent = auth.Parent.SessionID // the queue queuedChild read
	}
	ph, err := c.headers.get(ctx, c.st, parent)
	if err != nil {
		return protocol.BudgetGetReply{}, protocol.Errorf(protocol.CodeUnavailable, "read the header of session %s: %w", parent, err)
	}
	recs, err := c.budgetRecords(ctx, ph.Budgets)
	if err != nil {
		return protocol.BudgetGetReply{}, err
	}
	for i := range recs {
		recs[i] = shownLedger(recs[i], childID)
	}
	rep := protocol.BudgetGetReply{ChildID: childID, Budgets: recs, Queued: true}
	if b := e.Options.Budget; b != nil {
		rep.Budgets = append(rep.Budgets, protocol.BudgetRecord{SessionID: childID, Limits: *b})
		rep.Own = true
	}
	if rep.Budgets == nil {
		rep.Budgets = []protocol.BudgetRecord{}
	}
	return rep, nil
}

// budgetRaise is budget.raise: the child's own ledger gets the limits
// r.Raise names raised, by its exact live parent (at most to the parent's
// own remainder) or a user grant over its tree; then its pending budget
// requests are answered approved.
func (c *Coordinator) budgetRaise(ctx context.Context, _ rpc.Request, r protocol.BudgetRaiseRequest) (protocol.BudgetRaiseReply, error) {
	if err := checkSpend("raise", r.Raise); err != nil {
		return protocol.BudgetRaiseReply{}, err
	}
	if r.Raise.IsZero() {
		return protocol.BudgetRaiseReply{}, protocol.NewError(protocol.CodeInvalidArgument, map[string]any{"field": "raise",
			"reason": "raise names no limit: give at least one of tokens, modelRequests, toolCalls, children (a positive amount)"})
	}
	h, parent, err := c.budgetTarget(ctx, r.ChildID, r.Authority)
	if err != nil {
		return protocol.BudgetRaiseReply{}, err
	}
	if !slices.Contains(h.Budgets, h.ID) {
		if len(h.Budgets) == 0 {
			return protocol.BudgetRaiseReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "session %s draws on no budget: there is nothing to raise", h.ID)
		}
		return protocol.BudgetRaiseReply{}, protocol.Errorf(protocol.CodeInvalidArgument,
			"session %s has no budget of its own: it draws on the budget of %s; raise that one (by its parent or a user grant)", h.ID, h.Budgets[len(h.Budgets)-1])
	}
	by := protocol.Answerer{Kind: protocol.AnswererUser}
	rem := protocol.BudgetSpend{Tokens: math.MaxInt64, ModelRequests: math.MaxInt64, ToolCalls: math.MaxInt64, Children: math.MaxInt64}
	if parent != nil {
		by = protocol.Answerer{Kind: protocol.AnswererAgent, SessionID: parent.rec.SessionID}
		ph, err := c.headers.get(ctx, c.st, parent.rec.SessionID)
		if err != nil {
			return protocol.BudgetRaiseReply{}, protocol.Errorf(protocol.CodeUnavailable, "read the header of session %s: %w", parent.rec.SessionID, err)
		}
		recs, err := c.budgetRecords(ctx, ph.Budgets)
		if err != nil {
			return protocol.BudgetRaiseReply{}, err
		}
		rem, _ = protocol.BudgetRemainder(recs)
	} else if g, err := c.grantOf(ctx, r.Authority.Grant); err == nil {
		by.User = g.user
	}
	var out protocol.BudgetRecord
	rev, err := c.budgetWrite(ctx, h.ID, func(rec *protocol.BudgetRecord, _ int64) (bool, error) {
		raised, err := raiseLimits(*rec, r.Raise, rem)
		if err != nil {
			return false, err
		}
		rec.Limits = raised
		rec.Raises++
		rec.RaisedBy = &by
		out = *rec
		return true, nil
	})
	if err != nil {
		return protocol.BudgetRaiseReply{}, err
	}
	c.log.Info("budget raised", "session", h.ID, "raise", r.Raise, "by", by.Kind, "raises", out.Raises)
	return protocol.BudgetRaiseReply{Budget: shownLedger(out, h.ID), Resumed: c.resumeBudgetPauses(ctx, h.ID, rev, by, r.Raise)}, nil
}

// answerRaisedMeanwhile answers budget pause rec (pending, at revision
// rev, just opened) approved when its ledger (budgetOf) had more raises
// than raises, the count its refusal saw: such a raise landed before the
// request existed and found nothing to answer. It returns the request as
// it is now, and its revision. A failed read or answer leaves it pending
// (a later raise or an approve answers it).
func (c *Coordinator) answerRaisedMeanwhile(ctx context.Context, rec protocol.RequestRecord, rev uint64, raises int64) (protocol.RequestRecord, uint64) {
	led, err := c.st.Budget(ctx, rec.BudgetOf)
	if err != nil || led.Value.Raises <= raises {
		return rec, rev
	}
	by := protocol.Answerer{Kind: protocol.AnswererUser}
	if led.Value.RaisedBy != nil {
		by = *led.Value.RaisedBy
	}
	v := rec
	v.State = protocol.RequestApproved
	v.Answer = &protocol.RequestAnswer{State: protocol.RequestApproved, By: by, At: store.NowMs(), ID: ulid.Make().String(),
		Reason: fmt.Sprintf("budget raised before the pause opened (the budget of %s had %d raises, its refusal saw %d)", rec.BudgetOf, led.Value.Raises, raises)}
	nrev, err := c.st.AnswerRequest(ctx, v, rev)
	if err != nil {
		if !errors.Is(err, store.ErrConflict) {
			c.log.Warn("a budget pause opened after a raise could not be answered; it waits for the next", "request", rec.ID, "err", err)
		}
		if now, err := c.st.Request(ctx, rec.ID); err == nil {
			return now.Value, now.Revision
		}
		return rec, rev
	}
	c.log.Info("request answered by a raise that came before it", "request", rec.ID, "session", rec.SessionID, "budget", rec.BudgetOf)
	return v, nrev
}

// raiseIndexWait bounds how long a raise waits for its coordinator's watch
// of brood_agents to apply its ledger write before it looks for the
// pauses that write answers (resumeBudgetPauses); past it, it looks in
// what the watch holds.
const raiseIndexWait = 2 * time.Second

// shownLedger is ledger rec as budget.get and budget.raise show it to a
// caller acting on session id: only id's own reservations, without their
// credential hashes; what the others hold is one total, ReservedOthers
// (docs/security.md: a parent or a user grant sees its child's spending,
// not its siblings' sessions, runs, hosts or credentials).
func shownLedger(rec protocol.BudgetRecord, id string) protocol.BudgetRecord {
	own := make([]protocol.BudgetReservation, 0, len(rec.Reservations))
	for _, x := range rec.Reservations {
		if x.SessionID != id {
			rec.ReservedOthers = rec.ReservedOthers.Add(x.Spend)
			continue
		}
		x.CredentialHash = ""
		own = append(own, x)
	}
	rec.Reservations = own
	if len(own) == 0 {
		rec.Reservations = nil
	}
	rec.WriteID = ""
	return rec
}

// budgetTarget checks the authority acting on session id's budget and
// reads its header: a child's as continuable.state checks it (childFor;
// the parent is returned when it acted), and a root's for a user grant
// over its tree (a root has no parent to raise it: its user does).
func (c *Coordinator) budgetTarget(ctx context.Context, id string, auth protocol.Authority) (protocol.SessionHeader, *leaseState, error) {
	h, parent, err := c.childFor(ctx, id, auth, true)
	if err != nil && parent == nil && auth.Grant != "" && h.ID == id && protocol.CodeOf(err) == protocol.CodeInvalidArgument &&
		(h.ParentSession == "" || h.Origin != protocol.OriginSubagent) {
		// childFor refuses a root only once the grant was found to cover it.
		return h, nil, nil
	}
	return h, parent, err
}

// raiseLimits returns rec's limits raised by raise: each raised limit must
// be one rec names, stay at most BudgetValueMax, and leave at most rem of
// it remaining (the raiser's own remainder: budgets only tighten down the
// tree). INVALID_ARGUMENT or LIMIT_EXCEEDED name the limit.
func raiseLimits(rec protocol.BudgetRecord, raise, rem protocol.BudgetSpend) (protocol.Budget, error) {
	l := rec.Limits
	used := rec.Charged.Add(rec.Reserved())
	for _, f := range []struct {
		name, unit      string
		limit           *int64
		by, used, avail int64
	}{
		{protocol.BudgetLimitTokens, "tokens", &l.Tokens, raise.Tokens, used.Tokens, rem.Tokens},
		{protocol.BudgetLimitModelRequests, "model requests", &l.ModelRequests, raise.ModelRequests, used.ModelRequests, rem.ModelRequests},
		{protocol.BudgetLimitToolCalls, "tool calls", &l.ToolCalls, raise.ToolCalls, used.ToolCalls, rem.ToolCalls},
		{protocol.BudgetLimitChildren, "children", &l.Children, raise.Children, used.Children, rem.Children},
	} {
		if f.by == 0 {
			continue
		}
		switch {
		case *f.limit == 0:
			return l, protocol.NewError(protocol.CodeInvalidArgument, map[string]any{"field": "raise." + f.name,
				"reason": fmt.Sprintf("the budget of %s names no %s limit: there is none to raise", rec.SessionID, f.name)})
		case f.by > protocol.BudgetValueMax-*f.limit:
			return l, protocol.NewError(protocol.CodeInvalidArgument, map[string]any{"field": "raise." + f.name,
				"reason": fmt.Sprintf("raise.%s would make the limit above %d %s", f.name, int64(protocol.BudgetValueMax), f.unit)})
		}
		*f.limit += f.by
		if left := max(*f.limit-f.used, 0); left > f.avail {
			return rec.Limits, protocol.NewError(protocol.CodeLimitExceeded, map[string]any{"limit": "budget." + f.name, "unit": f.unit,
				"requested": left, "remaining": f.avail,
				"reason": fmt.Sprintf("after a raise of %d, %d %s would remain of the budget of %s; the raiser has only %d %s left of its own: a budget only tightens down the tree",
					f.by, left, f.unit, rec.SessionID, f.avail, f.unit)})
		}
	}
	return l, nil
}

// resumeBudgetPauses answers approved, by by, every pending budget request
// paused on the ledger of session id (its own, or a descendant's that
// drew on it), and wakes each asking session no activation holds. It
// finds them in the watch of brood_agents (agentIndex.pausesOn), once the
// watch applied rev, the raise's ledger write (at most raiseIndexWait),
// and returns the answered request ids. Best effort: a request not
// answered here (answered first, unreadable) is left as it is.
func (c *Coordinator) resumeBudgetPauses(ctx context.Context, id string, rev uint64, by protocol.Answerer, raise protocol.BudgetSpend) []string {
	resumed := []string{}
	wctx, cancel := context.WithTimeout(ctx, raiseIndexWait)
	caughtUp := c.agentsWatch.WaitApplied(wctx, rev)
	cancel()
	if !caughtUp {
		c.log.Warn("a raise looks for paused turns before its watch applied its write; a pause opened just before it waits for its request's answer or timeout",
			"session", id, "revision", rev, "bound", raiseIndexWait.String())
	}
	for _, rid := range c.agents.pausesOn(id) {
		rec, err := c.st.Request(ctx, rid)
		if err != nil {
			continue
		}
		v := rec.Value
		if v.Kind != protocol.RequestBudget || v.State != protocol.RequestPending || (v.SessionID != id && v.BudgetOf != id) {
			continue
		}
		if v.SessionID != id {
			// Paused on this ledger only if the asker draws on it (a
			// request opened before requests.open checked budgetOf could
			// name another tree's ledger).
			if h, err := c.headers.get(ctx, c.st, v.SessionID); err != nil || !slices.Contains(h.Budgets, id) {
				continue
			}
		}
		v.State = protocol.RequestApproved
		v.Answer = &protocol.RequestAnswer{State: protocol.RequestApproved, By: by, At: store.NowMs(), ID: ulid.Make().String(),
			Reason: "budget raised: " + raiseText(raise)}
		if _, err := c.st.AnswerRequest(ctx, v, rec.Revision); err != nil {
			if !errors.Is(err, store.ErrConflict) {
				c.log.Warn("a raise could not answer a budget request", "request", rid, "err", err)
			}
			continue
		}
		c.log.Info("request answered by a raise", "request", rid, "session", v.SessionID)
		c.wakeParked(ctx, v.SessionID)
		resumed = append(resumed, rid)
	}
	return resumed
}

// raiseText renders a raise as the CLI writes it: "tokens=+100000".
func raiseText(r protocol.BudgetSpend) string {
	var parts []string
	for _, f := range []struct {
		n string
		v int64
	}{{"tokens", r.Tokens}, {"modelRequests", r.ModelRequests}, {"toolCalls", r.ToolCalls}, {"children", r.Children}} {
		if f.v > 0 {
			parts = append(parts, fmt.Sprintf("%s=+%d", f.n, f.v))
		}
	}
	return strings.Join(parts, ",")
}
