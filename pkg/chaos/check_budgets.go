package chaos

import (
	"fmt"
	"sort"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/protocol"
)

// I11 (issue 32, item 2; docs/protocol.md §5.5, "Budgets"): budgets hold
// over a tree, and each reservation is charged or given back once.
//
// A budget's ledger (Snapshot.Budgets) is written only by coordinators, by
// compare-and-set; its tree is every session whose header lists it
// (SessionHeader.Budgets). What the tree spent is read from its logs:
// tokens and model requests as the steps report them
// (sessionlog.OwnUsage), tool calls that ran (a tool/result that is not an
// error: a call the budget refused is logged with an error result, and
// charged nothing), children started (members other than the budget's own
// session that opened a turn). The checker holds, per ledger, for each
// limit it names:
//
//   - the ledger within its limit: charged + reserved ≤ limit (tokens: plus
//     budgetTokensOverMax). Every grant is taken against what remains by
//     compare-and-set, and a dead host's reservation moves from reserved
//     to charged; a reservation charged twice (a late settle of a host
//     whose run was already settled HOST_LOST and its reservation swept,
//     or a sweep that charged without removing) leaves a ledger at its cap
//     above it;
//   - the tree within its limit: what the logs show ≤ limit (tokens: plus
//     budgetTokensOverMax), the issue's acceptance "budgets never exceeded
//     beyond the in-flight bound";
//   - the ledger never below the logs: charged + reserved ≥ what the logs
//     show, field by field. A step settles what it used; a reservation
//     left by a dead host (or a lost settlement) is charged in full, or
//     stays reserved until a coordinator that finds the ledger short
//     charges it (a reservation of a settled run left in flight is counted
//     as charged here, and in the summary). A model request or tool call
//     that went ahead without a reservation, or a used reservation given
//     back (refunded) instead of charged, leaves the ledger below its logs.
//
// It also holds that every session listing a budget finds its ledger (the
// ledger is created before the header), that a reservation id is held at
// most once per ledger, and only by a session of the ledger's tree.

// budgetTokensOverMax is the in-flight bound of docs/protocol.md §5.5
// ("The bound") for the chaos deployment: the tokens over every log of a
// tree are at most its budget plus the sum over its model requests of
// (actual input − estimated input)⁺, which is 0 for the scripted model the
// workers run (its input estimate is exact and its answers honour the
// grant).
const budgetTokensOverMax = 0

// budgetTree is what one ledger's tree spent according to its logs.
type budgetTree struct {
	members  []string
	tokens   int64
	requests int64
	toolRuns int64
	children int64
	// exhausted counts the tree's turns that ended BUDGET_EXHAUSTED.
	exhausted int
}

// checkBudgets: I11.
func (c *checker) checkBudgets() {
	trees := map[string]*budgetTree{}
	var ids []string
	for id, s := range c.sessions {
		if s.hasHeader && len(s.header.Budgets) > 0 {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		s := c.sessions[id]
		spent := c.sessionSpend(s)
		for _, b := range s.header.Budgets {
			c.checked("I11", s.header.CreatedAt)
			if _, ok := c.snap.Budgets[b]; !ok {
				c.fail("I11", s.header.CreatedAt, "session %s draws on budget %s, which has no ledger", id, b)
				continue
			}
			t := trees[b]
			if t == nil {
				t = &budgetTree{}
				trees[b] = t
			}
			t.members = append(t.members, id)
			t.tokens += spent.tokens
			t.requests += spent.requests
			t.toolRuns += spent.toolRuns
			t.exhausted += spent.exhausted
			if id != b && spent.turns > 0 {
				t.children++
			}
		}
	}
	for _, r := range c.snap.Runs {
		if r.Result != nil && r.Result.ErrorCode == protocol.CodeHostLost && len(c.snap.Headers[r.ChildID].Budgets) > 0 {
			c.sum.BudgetRunsHostLost++
		}
	}
	var ledgers []string
	for id := range c.snap.Budgets {
		ledgers = append(ledgers, id)
	}
	sort.Strings(ledgers)
	for _, id := range ledgers {
		t := trees[id]
		if t == nil {
			t = &budgetTree{}
		}
		c.checkLedger(id, c.snap.Budgets[id], t)
	}
}

// sessionSpend is what one session's own log shows it spent.
type sessionSpend struct {
	tokens, requests, toolRuns int64
	turns, exhausted           int
}

func (c *checker) sessionSpend(s *session) sessionSpend {
	evs := make([]protocol.SessionEvent, 0, len(s.events))
	for _, ev := range s.events {
		evs = append(evs, ev.session())
	}
	evs = sessionlog.Own(evs, s.header.SeedLength)
	u := sessionlog.OwnUsage(evs)
	out := sessionSpend{tokens: u.Tokens(), requests: u.ModelRequests}
	ran := map[string]bool{}
	for _, ev := range evs {
		switch ev.Type {
		case protocol.EvToolResult:
			var d protocol.ToolResultData
			if ev.Decode(&d) == nil && !d.IsError && !ran[d.CallID] {
				ran[d.CallID] = true
				out.toolRuns++
			}
		case protocol.EvTurnStart:
			out.turns++
		case protocol.EvTurnEnd:
			var d protocol.TurnEndData
			if ev.Decode(&d) == nil && d.Reason.Code == protocol.CodeBudgetExhausted {
				out.exhausted++
			}
		}
	}
	return out
}

// checkLedger holds one ledger against its limits and its tree's logs.
func (c *checker) checkLedger(id string, rec protocol.BudgetRecord, t *budgetTree) {
	at := rec.CreatedAt
	c.checked("I11", at)
	members := map[string]bool{}
	for _, m := range t.members {
		members[m] = true
	}
	held := map[string]bool{}
	for _, r := range rec.Reservations {
		if held[r.ID] {
			c.fail("I11", at, "budget %s holds reservation %s twice", id, r.ID)
		}
		held[r.ID] = true
		if !members[r.SessionID] {
			c.fail("I11", at, "budget %s holds reservation %s of session %s, which does not draw on it", id, r.ID, r.SessionID)
		}
		if run, ok := c.snap.Runs[r.RunID]; ok && run.State == protocol.RunSettled {
			c.sum.BudgetReservationsLeft++
		}
	}
	used := rec.Charged.Add(rec.Reserved())
	for _, f := range []struct {
		name         string
		limit, over  int64
		ledger, logs int64
	}{
		{protocol.BudgetLimitTokens, rec.Limits.Tokens, budgetTokensOverMax, used.Tokens, t.tokens},
		{protocol.BudgetLimitModelRequests, rec.Limits.ModelRequests, 0, used.ModelRequests, t.requests},
		{protocol.BudgetLimitToolCalls, rec.Limits.ToolCalls, 0, used.ToolCalls, t.toolRuns},
		{protocol.BudgetLimitChildren, rec.Limits.Children, 0, used.Children, t.children},
	} {
		if f.limit > 0 {
			if f.ledger > f.limit+f.over {
				c.sum.BudgetBreaches++
				c.fail("I11", at, "budget %s charged and reserved %d %s, over its limit of %d (+%d in flight): a reservation was charged twice or granted past the limit",
					id, f.ledger, f.name, f.limit, f.over)
			}
			if f.logs > f.limit+f.over {
				c.sum.BudgetBreaches++
				c.fail("I11", at, "budget %s: its tree's logs (%d sessions) show %d %s, over its limit of %d (+%d in flight)",
					id, len(t.members), f.logs, f.name, f.limit, f.over)
			}
			if f.ledger >= f.limit {
				c.sum.BudgetLimitsReached++
			}
		}
		if f.ledger < f.logs {
			c.sum.BudgetBreaches++
			c.fail("I11", at, "budget %s charged and reserved %d %s, less than its tree's logs show (%d over %d sessions): a spend went ahead without a reservation, or a used one was given back",
				id, f.ledger, f.name, f.logs, len(t.members))
		}
	}
	c.sum.Budgets++
	c.sum.BudgetTurnsExhausted += t.exhausted
	c.sum.BudgetTokensLogged += t.tokens
	c.sum.BudgetTokensCharged += rec.Charged.Tokens
	c.sum.BudgetReservations += len(rec.Reservations)
}

// budgetLine is the summary's I11 line.
func (s Summary) budgetLine() string {
	return fmt.Sprintf("budgets: %d ledgers, %d limits reached, %d turns ended BUDGET_EXHAUSTED; %d pauses approved (%d raises), %d denied or timed out; %d tokens over their trees' logs, %d charged; %d reservations in flight at the end (%d of settled runs); %d budgeted runs and epochs settled HOST_LOST; %d breaches",
		s.Budgets, s.BudgetLimitsReached, s.BudgetTurnsExhausted, s.BudgetPausesApproved, s.BudgetRaises, s.BudgetPausesDenied,
		s.BudgetTokensLogged, s.BudgetTokensCharged, s.BudgetReservations, s.BudgetReservationsLeft, s.BudgetRunsHostLost, s.BudgetBreaches)
}
