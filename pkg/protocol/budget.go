package protocol

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Budgets on a delegation (docs/protocol.md §5.5, "Budgets"; issue 32,
// item 2). A budget caps what a session and every session under it may
// spend in total: tokens, model requests, tool calls, children started,
// and wall time up to a deadline. It is named on agents.open (a root's),
// runs.start and continuable.start (a child's), by the subagent tool's
// `budget` argument and by the CLI's --budget. Budgets only tighten down
// the tree: a child's is at most what remains of each budget it draws on,
// and a child that names none draws on its parent's.
//
// Each budget is one ledger record in brood_agents (BudgetRecord,
// budget.<sessionId>, the session that named it), written only by
// coordinators by compare-and-set; a session's header lists the ledgers it
// draws on (SessionHeader.Budgets), and every model request, tool call and
// child start of the session goes ahead only against a reservation taken
// on every one of them.

// Budget is a budget's limits as a start names them. A zero field is
// absent: no limit of its own (an enclosing budget's still holds). Every
// field is a whole number up to BudgetValueMax; at least one is set.
type Budget struct {
	// Tokens caps input plus output tokens, as the models report them
	// (docs/protocol.md §6.6), in tokens.
	Tokens int64 `msgpack:"tokens,omitempty" json:"tokens,omitempty"`
	// ModelRequests caps model requests (steps), in requests.
	ModelRequests int64 `msgpack:"modelRequests,omitempty" json:"modelRequests,omitempty"`
	// ToolCalls caps tool calls, in calls.
	ToolCalls int64 `msgpack:"toolCalls,omitempty" json:"toolCalls,omitempty"`
	// Children caps children started in total (not live at once: that is
	// the live-children limit), in children.
	Children int64 `msgpack:"children,omitempty" json:"children,omitempty"`
	// DeadlineMs is the wall time the budget lasts, in milliseconds from
	// its admission: past it nothing more is reserved and a running turn
	// under it ends BUDGET_EXHAUSTED (limit deadline).
	DeadlineMs int64 `msgpack:"deadlineMs,omitempty" json:"deadlineMs,omitempty"`
}

// BudgetValueMax bounds every budget field: 2^53−1, the largest integer
// every client decodes exactly. A larger one is INVALID_ARGUMENT.
const BudgetValueMax = maxSafeInteger

// BudgetTokens is what usage u charges a budget's tokens: its input and
// output tokens, at most BudgetValueMax (a report past it, or whose sum
// overflows, exhausts any budget instead of making budget.settle refuse
// it); ok is false when u reports nothing to charge by (nil, Unknown, or a
// negative count: never a credit), and the caller charges the grant.
func (u *Usage) BudgetTokens() (tokens int64, ok bool) {
	if u == nil || u.Unknown || u.InputTokens < 0 || u.OutputTokens < 0 {
		return 0, false
	}
	if u.InputTokens > BudgetValueMax || u.OutputTokens > BudgetValueMax-u.InputTokens {
		return BudgetValueMax, true
	}
	return u.InputTokens + u.OutputTokens, true
}

// BudgetDeadlineMsMax bounds a budget's DeadlineMs: 30 days, in
// milliseconds. A longer one is INVALID_ARGUMENT (a deadline past it is no
// deadline; leave it out).
const BudgetDeadlineMsMax int64 = 30 * 24 * 60 * 60 * 1000

// The limits a budget names, as error details and the CLI name them.
const (
	BudgetLimitTokens        = "tokens"
	BudgetLimitModelRequests = "modelRequests"
	BudgetLimitToolCalls     = "toolCalls"
	BudgetLimitChildren      = "children"
	BudgetLimitDeadline      = "deadlineMs"
)

type budgetField struct {
	name, unit string
	v          int64
}

func (b Budget) fields() []budgetField {
	return []budgetField{
		{BudgetLimitTokens, "tokens", b.Tokens},
		{BudgetLimitModelRequests, "model requests", b.ModelRequests},
		{BudgetLimitToolCalls, "tool calls", b.ToolCalls},
		{BudgetLimitChildren, "children", b.Children},
		{BudgetLimitDeadline, "milliseconds", b.DeadlineMs},
	}
}

// IsZero reports whether the budget names no limit.
func (b Budget) IsZero() bool { return b == Budget{} }

// Validate checks a budget as a start names it: at least one field, each
// absent (0) or a positive whole number up to BudgetValueMax (DeadlineMs
// up to BudgetDeadlineMsMax); else INVALID_ARGUMENT with details `field`
// (budget.<name>), `unit` and `value`. (A non-integer, NaN or a string is
// refused by the decoder before this, INVALID_ARGUMENT naming the field.)
func (b Budget) Validate() error {
	if b.IsZero() {
		return NewError(CodeInvalidArgument, map[string]any{"field": "budget",
			"reason": "budget names no limit: give at least one of tokens, modelRequests, toolCalls, children, deadlineMs, or leave it out"})
	}
	for _, f := range b.fields() {
		max := int64(BudgetValueMax)
		if f.name == BudgetLimitDeadline {
			max = BudgetDeadlineMsMax
		}
		if f.v < 0 || f.v > max {
			return NewError(CodeInvalidArgument, map[string]any{"field": "budget." + f.name, "unit": f.unit, "value": f.v,
				"reason": fmt.Sprintf("budget.%s must be a positive whole number of %s up to %d (or absent), not %d", f.name, f.unit, max, f.v)})
		}
	}
	return nil
}

// BudgetSpend is what was spent, or is reserved, against a budget: tokens
// (input plus output), model requests, tool calls and children started.
type BudgetSpend struct {
	Tokens        int64 `msgpack:"tokens,omitempty" json:"tokens,omitempty"`
	ModelRequests int64 `msgpack:"modelRequests,omitempty" json:"modelRequests,omitempty"`
	ToolCalls     int64 `msgpack:"toolCalls,omitempty" json:"toolCalls,omitempty"`
	Children      int64 `msgpack:"children,omitempty" json:"children,omitempty"`
}

// Add returns s plus o, field by field.
func (s BudgetSpend) Add(o BudgetSpend) BudgetSpend {
	return BudgetSpend{s.Tokens + o.Tokens, s.ModelRequests + o.ModelRequests, s.ToolCalls + o.ToolCalls, s.Children + o.Children}
}

// IsZero reports whether nothing is spent.
func (s BudgetSpend) IsZero() bool { return s == BudgetSpend{} }

// BudgetReservation is a spend in flight against a ledger: taken before a
// model request (its token estimate and one request), a step's tool calls
// or a child start, and settled once after it (the actual charged, the
// rest released). RunID and HostID are the run (or epoch) and host of the
// session's lease when it was taken: a run settled while its reservation
// is still here (its host died, or its settlement was lost) has it charged
// in full by the next coordinator that writes the ledger, once.
type BudgetReservation struct {
	ID        string `msgpack:"id" json:"id"`
	SessionID string `msgpack:"sessionId" json:"sessionId"`
	RunID     string `msgpack:"runId,omitempty" json:"runId,omitempty"`
	HostID    string `msgpack:"hostId,omitempty" json:"hostId,omitempty"`
	// CredentialHash is the session's credential hash when it was taken:
	// only that credential settles it.
	CredentialHash string      `msgpack:"credentialHash" json:"credentialHash,omitempty"`
	Spend          BudgetSpend `msgpack:"spend" json:"spend"`
	At             int64       `msgpack:"at" json:"at"`
}

// BudgetReservationsMax bounds the reservations in flight on one ledger:
// a reservation past it waits for none, it is refused UNAVAILABLE
// (retried by the worker) — each live session has at most a few in
// flight, so this is only reached by a tree of more live sessions than the
// live-children limit allows under one parent several levels deep.
const BudgetReservationsMax = 1024

// BudgetRecord is the ledger of one budget, brood_agents
// budget.<sessionId> (docs/protocol.md §7.6), written only by coordinators
// by compare-and-set: Limits as named, DeadlineAt the absolute deadline
// (epoch ms, 0: none), Charged what was spent and settled, Reservations
// what is in flight. Remaining = Limits − Charged − Σ Reservations, per
// field.
type BudgetRecord struct {
	SessionID    string              `msgpack:"sessionId" json:"sessionId"`
	Limits       Budget              `msgpack:"limits" json:"limits"`
	DeadlineAt   int64               `msgpack:"deadlineAt,omitempty" json:"deadlineAt,omitempty"`
	Charged      BudgetSpend         `msgpack:"charged" json:"charged"`
	Reservations []BudgetReservation `msgpack:"reservations,omitempty" json:"reservations,omitempty"`
	CreatedAt    int64               `msgpack:"createdAt" json:"createdAt"`
	// DeadlineEndedAt is when a coordinator had ended the budget's subtree
	// at its deadline (epoch ms, 0: not yet): every live session under the
	// session that named it disposed, child first. The deadline sweeps
	// skip a ledger that has it.
	DeadlineEndedAt int64 `msgpack:"deadlineEndedAt,omitempty" json:"deadlineEndedAt,omitempty"`
	// WriteID is fresh on every write (a ULID): two writers that made the
	// same change from the same revision write different bytes, so the
	// loser's refused compare-and-set is never taken for its own write
	// landed (the store judges a refused write whose bytes are the key's
	// its own).
	WriteID string `msgpack:"writeId,omitempty" json:"writeId,omitempty"`
	// Raises counts the raises the ledger had (budget.raise), and
	// RaisedBy is who gave the last one. A refusal names the count it saw
	// (BUDGET_EXHAUSTED's detail `raises`) and the budget pause it opens
	// repeats it (RequestOpenRequest.BudgetRaises): a pause opened after a
	// raise it never saw is answered at once (docs/protocol.md §5.5,
	// "Pause and raise").
	Raises   int64     `msgpack:"raises,omitempty" json:"raises,omitempty"`
	RaisedBy *Answerer `msgpack:"raisedBy,omitempty" json:"raisedBy,omitempty"`
	// ReservedOthers is only in budget.get's and budget.raise's replies,
	// never in the bucket: what the reservations not shown to the caller
	// hold in total (Reservations then lists only the asked-about
	// session's own, without their credentialHash; docs/security.md).
	ReservedOthers BudgetSpend `msgpack:"reservedOthers,omitempty" json:"reservedOthers,omitzero"`
}

// Reserved is the sum of the reservations in flight (those a reply left
// out included: ReservedOthers).
func (r BudgetRecord) Reserved() BudgetSpend {
	s := r.ReservedOthers
	for _, x := range r.Reservations {
		s = s.Add(x.Spend)
	}
	return s
}

// Remaining is what the ledger still allows, per limit it names (a field
// it does not name is math.MaxInt64): its limit less what was charged and
// what is reserved, never below 0.
func (r BudgetRecord) Remaining() BudgetSpend {
	used := r.Charged.Add(r.Reserved())
	rem := func(limit, u int64) int64 {
		if limit == 0 {
			return math.MaxInt64
		}
		return max(limit-u, 0)
	}
	return BudgetSpend{
		Tokens:        rem(r.Limits.Tokens, used.Tokens),
		ModelRequests: rem(r.Limits.ModelRequests, used.ModelRequests),
		ToolCalls:     rem(r.Limits.ToolCalls, used.ToolCalls),
		Children:      rem(r.Limits.Children, used.Children),
	}
}

// Exhausted returns the BUDGET_EXHAUSTED error for a want the ledger
// cannot grant at now (the first limit short, in the order tokens, model
// requests, tool calls, children; the deadline before them), nil when it
// can. A token want is granted when at least minTokens remain (the grant
// may be less than want.Tokens: Grant). The error's details name the
// ledger's raise count (`raises`) and, for a counted limit, what the want
// needed (`needed`, at least) and what was left (`remaining`).
func (r BudgetRecord) Exhausted(want BudgetSpend, minTokens, now int64) error {
	if r.DeadlineAt > 0 && now >= r.DeadlineAt {
		return r.exhausted(BudgetLimitDeadline, "milliseconds", r.Limits.DeadlineMs, now-r.CreatedAt, 0, 0)
	}
	rem := r.Remaining()
	used := r.Charged.Add(r.Reserved())
	if need := max(minTokens, 1); want.Tokens > 0 && rem.Tokens < need {
		return r.exhausted(BudgetLimitTokens, "tokens", r.Limits.Tokens, used.Tokens, need, rem.Tokens)
	}
	for _, f := range []struct {
		name, unit       string
		want, rem, limit int64
		used             int64
	}{
		{BudgetLimitModelRequests, "model requests", want.ModelRequests, rem.ModelRequests, r.Limits.ModelRequests, used.ModelRequests},
		{BudgetLimitToolCalls, "tool calls", want.ToolCalls, rem.ToolCalls, r.Limits.ToolCalls, used.ToolCalls},
		{BudgetLimitChildren, "children", want.Children, rem.Children, r.Limits.Children, used.Children},
	} {
		if f.want > 0 && f.rem < f.want {
			return r.exhausted(f.name, f.unit, f.limit, f.used, f.want, f.rem)
		}
	}
	return nil
}

// exhausted is BudgetExhausted of r, with its raise count and, when some
// of the limit is left but less than the want needed, a message that says
// so: "the next step needs at least 8 tokens; 5 of 12 tokens are left (7
// used)" rather than a limit "reached".
func (r BudgetRecord) exhausted(limit, unit string, value, usage, needed, left int64) *Error {
	e := BudgetExhausted(r.SessionID, limit, unit, value, usage)
	e.Details["raises"] = r.Raises
	if needed <= 0 {
		return e
	}
	e.Details["needed"], e.Details["remaining"] = needed, left
	if left <= 0 {
		return e
	}
	atLeast := ""
	if limit == BudgetLimitTokens {
		atLeast = "at least " // a token want is granted in part, from minTokens
	}
	e.Message = fmt.Sprintf("the budget of %s is short: the next step needs %s%d %s of its %s limit; %d of %d %s are left (%d used); %s",
		r.SessionID, atLeast, needed, unit, limit, left, value, unit, usage, catalogueByCode[CodeBudgetExhausted].Hint)
	return e
}

// BudgetExhausted is the BUDGET_EXHAUSTED error of the budget named by
// session budgetOf whose limit (its name and unit) is reached: usage is
// what was charged and reserved against it.
func BudgetExhausted(budgetOf, limit, unit string, value, usage int64) *Error {
	return NewError(CodeBudgetExhausted, map[string]any{"budget": budgetOf, "limit": limit, "unit": unit, "value": value, "usage": usage})
}

// BudgetRemainder is, per limit, the least that remains of the ledgers
// recs (math.MaxInt64 where none names the limit), and the earliest
// deadline among them (0: none).
func BudgetRemainder(recs []BudgetRecord) (BudgetSpend, int64) {
	rem := BudgetSpend{math.MaxInt64, math.MaxInt64, math.MaxInt64, math.MaxInt64}
	var deadline int64
	for _, r := range recs {
		x := r.Remaining()
		rem = BudgetSpend{min(rem.Tokens, x.Tokens), min(rem.ModelRequests, x.ModelRequests), min(rem.ToolCalls, x.ToolCalls), min(rem.Children, x.Children)}
		if r.DeadlineAt > 0 && (deadline == 0 || r.DeadlineAt < deadline) {
			deadline = r.DeadlineAt
		}
	}
	return rem, deadline
}

// WithinRemainder refuses a child's budget b above what remains of the
// budgets it would draw on (rem and deadline, BudgetRemainder) at now:
// LIMIT_EXCEEDED with details `limit` (budget.<name>), `unit`,
// `requested` and `remaining`. A budget only tightens down the tree.
func (b Budget) WithinRemainder(rem BudgetSpend, deadline, now int64) error {
	for _, f := range []struct {
		name, unit string
		v, rem     int64
	}{
		{BudgetLimitTokens, "tokens", b.Tokens, rem.Tokens},
		{BudgetLimitModelRequests, "model requests", b.ModelRequests, rem.ModelRequests},
		{BudgetLimitToolCalls, "tool calls", b.ToolCalls, rem.ToolCalls},
		// The child's own start is charged to the enclosing budgets
		// before its own exists, so one child less remains for its budget.
		{BudgetLimitChildren, "children", b.Children, max(rem.Children-1, 0)},
	} {
		if f.v > 0 && f.v > f.rem {
			return NewError(CodeLimitExceeded, map[string]any{"limit": "budget." + f.name, "unit": f.unit, "requested": f.v, "remaining": f.rem,
				"reason": fmt.Sprintf("budget.%s %d is above the %d %s that remain of the budgets this child draws on; a budget only tightens down the tree", f.name, f.v, f.rem, f.unit)})
		}
	}
	if b.DeadlineMs > 0 && deadline > 0 && now+b.DeadlineMs > deadline {
		return NewError(CodeLimitExceeded, map[string]any{"limit": "budget." + BudgetLimitDeadline, "unit": "milliseconds", "requested": b.DeadlineMs, "remaining": max(deadline-now, 0),
			"reason": fmt.Sprintf("budget.deadlineMs %d ends after the deadline of the budgets this child draws on, %d ms from now; a budget only tightens down the tree", b.DeadlineMs, max(deadline-now, 0))})
	}
	return nil
}

// ParseBudget parses the CLI's budget text: comma-separated name=value
// pairs, names tokens, modelRequests (or requests), toolCalls (or tools),
// children and deadline (or deadlineMs); counts take a k (thousand) or m
// (million) suffix, deadline a Go duration (15m, 1h30m) or plain
// milliseconds. "tokens=200k,children=20,deadline=15m". An unknown name, a
// repeated one or a bad value is INVALID_ARGUMENT naming it; the result is
// validated (Validate).
func ParseBudget(s string) (Budget, error) {
	var b Budget
	seen := map[string]bool{}
	bad := func(format string, args ...any) (Budget, error) {
		return Budget{}, Errorf(CodeInvalidArgument, "--budget: "+format, args...)
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, val, ok := strings.Cut(part, "=")
		if !ok {
			return bad("%q is not name=value", part)
		}
		var dst *int64
		switch name = strings.TrimSpace(name); name {
		case "tokens":
			dst = &b.Tokens
		case "modelRequests", "requests":
			dst, name = &b.ModelRequests, "modelRequests"
		case "toolCalls", "tools":
			dst, name = &b.ToolCalls, "toolCalls"
		case "children":
			dst = &b.Children
		case "deadline", "deadlineMs":
			dst, name = &b.DeadlineMs, "deadline"
		default:
			return bad("unknown limit %q: use tokens, modelRequests, toolCalls, children or deadline", name)
		}
		if seen[name] {
			return bad("%s given twice", name)
		}
		seen[name] = true
		v, err := parseBudgetValue(name, strings.TrimSpace(val))
		if err != nil {
			return bad("%s=%s: %v", name, val, err)
		}
		*dst = v
	}
	if b.IsZero() {
		return bad("names no limit: give at least one of tokens, modelRequests, toolCalls, children or deadline (tokens=200k,deadline=15m)")
	}
	return b, b.Validate()
}

func parseBudgetValue(name, val string) (int64, error) {
	if name == "deadline" {
		d, err := time.ParseDuration(val)
		if err != nil {
			n, nerr := strconv.ParseInt(val, 10, 64)
			if nerr != nil {
				return 0, fmt.Errorf("want a duration (15m, 1h30m) or whole milliseconds")
			}
			d = time.Duration(n) * time.Millisecond
			if n > BudgetDeadlineMsMax {
				d = time.Duration(BudgetDeadlineMsMax+1) * time.Millisecond
			}
		}
		switch {
		case d < time.Millisecond:
			return 0, fmt.Errorf("a deadline must be at least 1ms")
		case d.Milliseconds() > BudgetDeadlineMsMax:
			return 0, fmt.Errorf("a deadline is at most %s", time.Duration(BudgetDeadlineMsMax)*time.Millisecond)
		}
		return d.Milliseconds(), nil
	}
	mult := int64(1)
	switch {
	case strings.HasSuffix(val, "k"), strings.HasSuffix(val, "K"):
		mult, val = 1_000, val[:len(val)-1]
	case strings.HasSuffix(val, "m") && name != "deadline", strings.HasSuffix(val, "M"):
		mult, val = 1_000_000, val[:len(val)-1]
	}
	n, err := strconv.ParseInt(val, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("want a positive whole number")
	}
	if n > BudgetValueMax/mult {
		return 0, fmt.Errorf("above %d", int64(BudgetValueMax))
	}
	return n * mult, nil
}

// String renders the budget as ParseBudget reads it (deadline in
// milliseconds).
func (b Budget) String() string {
	var parts []string
	for _, f := range b.fields() {
		if f.v != 0 {
			name := f.name
			if name == BudgetLimitDeadline {
				name = "deadline"
				parts = append(parts, fmt.Sprintf("%s=%dms", name, f.v))
				continue
			}
			parts = append(parts, fmt.Sprintf("%s=%d", name, f.v))
		}
	}
	return strings.Join(parts, ",")
}

// BudgetReserveRequest is the body of budget.reserve (docs/protocol.md
// §5.22): the session Self (its own credential, a live agent) asks to
// spend Want (tokens, model requests, tool calls; never children, which
// its starts are charged) on every budget it draws on. TokensMin is the
// least token grant that lets its model request go ahead (its prompt's
// estimate and one output token); 0 with Want.Tokens 0.
//
// Tokens are granted in full when free (the limit less what is charged and
// reserved); when they are not, the reservations of runs settled long ago
// are charged and removed first, and if another session's reservation
// still holds tokens, nothing is reserved and the reply says to ask again
// (RetryMs): those are estimates, mostly released when settled. NoWait, or
// no other session's tokens in flight (Self's own are not waited for),
// grants what is free when that is at least TokensMin (the budget is
// nearly spent: the answer is bounded to it), else BUDGET_EXHAUSTED.
type BudgetReserveRequest struct {
	Self      ParentRef   `msgpack:"self" json:"self"`
	Want      BudgetSpend `msgpack:"want" json:"want"`
	TokensMin int64       `msgpack:"tokensMin,omitempty" json:"tokensMin,omitempty"`
	NoWait    bool        `msgpack:"noWait,omitempty" json:"noWait,omitempty"`
}

// BudgetReserveReply grants a reservation: ReservationID to settle it by
// ("" when the session draws on no budget: nothing to settle), Granted
// what it holds (Tokens between TokensMin and Want.Tokens, the rest as
// asked).
type BudgetReserveReply struct {
	ReservationID string      `msgpack:"reservationId,omitempty" json:"reservationId,omitempty"`
	Granted       BudgetSpend `msgpack:"granted" json:"granted"`
	// RetryMs, when not 0, says nothing was reserved: the tokens wanted
	// are held by other sessions' reservations in flight; ask again after
	// this many milliseconds (BudgetRetryMs).
	RetryMs int64 `msgpack:"retryMs,omitempty" json:"retryMs,omitempty"`
}

// BudgetRetryMs is the wait a budget.reserve answers when the tokens it
// wants are held by reservations in flight, in milliseconds.
const BudgetRetryMs = 25

// BudgetSettleRequest is the body of budget.settle: the session Self
// settles its reservation ReservationID, charging Used (what the step
// actually spent) and releasing the rest. Settling twice charges once.
type BudgetSettleRequest struct {
	Self          ParentRef   `msgpack:"self" json:"self"`
	ReservationID string      `msgpack:"reservationId" json:"reservationId"`
	Used          BudgetSpend `msgpack:"used" json:"used"`
}

// BudgetStartTokensMax bounds the first model request's reservation a
// coordinator takes at admission (SessionHeader.BudgetStartTokens): the
// prompt's bytes (a token is rarely shorter than a byte) plus this, in
// tokens, for the system prompt, the tools and the answer.
const BudgetStartTokensMax int64 = 16384

// BudgetStartGrant is the first model request's reservation taken at a
// one-shot child's admission under budget b with prompt bytes promptBytes:
// min(b.Tokens, promptBytes + BudgetStartTokensMax) (the second alone
// without a token limit). b is validated: it allows at least one request.
func BudgetStartGrant(b Budget, promptBytes int64) int64 {
	g := promptBytes + BudgetStartTokensMax
	if b.Tokens > 0 {
		g = min(g, b.Tokens)
	}
	return g
}

// BudgetGetRequest is the body of budget.get: the ledgers child ChildID
// draws on, read by its exact live parent (Authority.Parent) or a user
// grant over its tree, as continuable.state is authorised.
type BudgetGetRequest struct {
	ChildID   string    `msgpack:"childId" json:"childId"`
	Authority Authority `msgpack:"authority" json:"authority"`
}

// BudgetGetReply is the child's ledgers, root-most first (its header's
// Budgets; the last is its own when its start named one, Own). Each
// record's remaining is its limits less charged less reserved (per
// limit it names); empty when the child draws on no budget.
//
// Queued: the child's continuable.start waits in its parent's start queue
// (it has no session yet): Budgets are the ledgers it will draw on, its
// parent's, then, when its start named a budget (Own), that budget as a
// ledger not yet created: its limits, nothing charged or reserved,
// CreatedAt 0 (it is created, its deadline counted, when the child
// starts).
type BudgetGetReply struct {
	ChildID string         `msgpack:"childId" json:"childId"`
	Budgets []BudgetRecord `msgpack:"budgets" json:"budgets"`
	Own     bool           `msgpack:"own,omitempty" json:"own,omitempty"`
	Queued  bool           `msgpack:"queued,omitempty" json:"queued,omitempty"`
}

// BudgetRaiseRequest is the body of budget.raise (docs/protocol.md §5.5,
// "Pause and raise"): the child's own ledger (budget.<childId>) gets each
// limit Raise names raised by that many (tokens, model requests, tool
// calls, children; each 0 to BudgetValueMax, at least one positive; a
// limit the ledger does not name cannot be raised). Authority is as
// continuable.followup's: the child's exact live parent, or a user grant
// over its tree; a sibling or a stranger is UNAUTHORIZED. A parent raises
// at most to what remains of its own budgets: after the raise, what
// remains of the child's ledger for each raised limit is at most the
// parent's remainder for it (LIMIT_EXCEEDED otherwise, nothing written).
// A raise then answers the child's pending budget requests approved, so a
// paused turn reserves again and continues. A root's own budget is raised
// by a user grant over its tree only (ChildID the root's id).
type BudgetRaiseRequest struct {
	ChildID   string      `msgpack:"childId" json:"childId"`
	Authority Authority   `msgpack:"authority" json:"authority"`
	Raise     BudgetSpend `msgpack:"raise" json:"raise"`
}

// BudgetRaiseReply is the child's ledger as the raise wrote it, and the
// budget requests the raise answered (the paused turns it wakes).
type BudgetRaiseReply struct {
	Budget  BudgetRecord `msgpack:"budget" json:"budget"`
	Resumed []string     `msgpack:"resumed" json:"resumed"`
}

// ParseBudgetRaise parses the CLI's raise, "tokens=+100k,modelRequests=+5"
// (the + is optional; names and suffixes as ParseBudget; no deadline; a
// limit named twice, under either of its names, is INVALID_ARGUMENT).
func ParseBudgetRaise(s string) (BudgetSpend, error) {
	var r BudgetSpend
	if strings.TrimSpace(s) == "" {
		return r, Errorf(CodeInvalidArgument, "--raise names at least one limit, e.g. tokens=+100k")
	}
	for _, part := range strings.Split(s, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return BudgetSpend{}, Errorf(CodeInvalidArgument, "--raise: %q is not name=+amount", part)
		}
		val = strings.TrimPrefix(strings.TrimSpace(val), "+")
		var f *int64
		switch strings.TrimSpace(name) {
		case "tokens":
			f = &r.Tokens
		case "modelRequests", "requests":
			f = &r.ModelRequests
		case "toolCalls", "tools":
			f = &r.ToolCalls
		case "children":
			f = &r.Children
		default:
			return BudgetSpend{}, Errorf(CodeInvalidArgument, "--raise: unknown limit %q: a raise names tokens, modelRequests, toolCalls or children (a deadline is not raised)", name)
		}
		if *f != 0 {
			return BudgetSpend{}, Errorf(CodeInvalidArgument, "--raise: %s given twice", strings.TrimSpace(name))
		}
		n, err := parseBudgetValue(name, val)
		if err != nil {
			return BudgetSpend{}, Errorf(CodeInvalidArgument, "--raise: %s=%s: %v", name, val, err)
		}
		*f = n
	}
	return r, nil
}
