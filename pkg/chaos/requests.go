package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Requests in the workload (issue 33; docs/protocol.md §5.21): some
// children's scripts call a tool that needs approval or ask a question, so
// their call parks on a request; the clients list the pending requests of
// their roots' trees and answer them, sometimes twice at once from two
// authorities (exactly one answer may win), sometimes not at all (the
// coordinators' request timeout then denies), and sometimes with another
// root's credential (it must be refused). A continuable child whose
// background grandchild asks is told of the request and answers it with
// its answer_request tool, racing the clients.
//
// The side effects of approved calls land in the workspace every root
// works in: run_command appends its token to RanFile, write_file writes
// WriteDir/<token>.txt holding the token. The checker counts them (I10).
const (
	// RanFile is the workspace file every approved run_command of the
	// workload appends one line to: its token.
	RanFile = "ran.txt"
	// WriteDir is the workspace directory the workload's write_file calls
	// write <token>.txt in.
	WriteDir = "w"
)

// askingCallsMax bounds the parked calls one scripted step makes at once.
const askingCallsMax = 2

// requestTokenRE finds the token of a workload call that parks (r<op>-<n>)
// in its arguments.
var requestTokenRE = regexp.MustCompile(`\br(\d+)-(\d+)\b`)

// askingCalls returns one or two scripted calls (in parallel, one model
// answer) that park on a request: run_command appending its token to
// RanFile, write_file of WriteDir/<token>.txt, or the ask tool with or
// without choices. Tokens are r<opID>-<n>, unique in the history.
func (c *wclient) askingCalls(opID int64) string {
	n := 1 + c.rng.Intn(askingCallsMax)
	var lines []string
	for i := 1; i <= n; i++ {
		tok := fmt.Sprintf("r%d-%d", opID, i)
		var tool string
		var args map[string]any
		switch c.rng.Intn(3) {
		case 0:
			tool, args = "run_command", map[string]any{"command": "echo " + tok + " >> " + RanFile}
		case 1:
			tool, args = "write_file", map[string]any{"path": WriteDir + "/" + tok + ".txt", "content": tok}
		default:
			tool, args = "ask", map[string]any{"question": "go on with " + tok + "?"}
			if c.rng.Intn(2) == 0 {
				args["choices"] = []string{"yes", "no"}
			}
		}
		b, _ := json.Marshal(args)
		lines = append(lines, "call "+tool+" "+string(b))
	}
	return strings.Join(lines, "\n")
}

// answerOnLines are the scripted model's on lines with which a continuable
// child answers the notice of a request of its descendants: an approval
// approved, a question answered "yes" (one of the workload's choices, and
// free text otherwise).
const answerOnLines = `on /approval to run \S+ \(request (r[0-9a-f]{24})\)/ call answer_request {"requestId":"$1","decision":"approve"}` + "\n" +
	`on /asks a question \(request (r[0-9a-f]{24})\)/ call answer_request {"requestId":"$1","decision":"answer","text":"yes"}`

// askingRunScript is a one-shot prompt whose child asks, or (one in three)
// whose one-shot grandchild asks (no agent above it takes requests: the
// clients answer).
func (c *wclient) askingRunScript(opID int64, marker string) string {
	calls := c.askingCalls(opID)
	if c.rng.Intn(3) == 0 {
		return subagentCall(calls+"\nsay leaf", false) + "\nsay " + marker
	}
	return calls + "\nsay " + marker
}

// askingStartScript is a continuable child's first prompt that asks, or
// (one in three) whose background grandchild asks and which answers its
// notice itself (answerOnLines), racing the clients.
func (c *wclient) askingStartScript(opID int64, marker string) string {
	calls := c.askingCalls(opID)
	if c.rng.Intn(3) == 0 {
		return subagentCall(calls+"\nsay grandchild", true) + "\nsay " + marker + "\n" + answerOnLines
	}
	return calls + "\nsay " + marker
}

// answerer is one authority that may answer a request of a root's tree.
type answerer struct {
	name string
	auth protocol.Authority
}

// plannedAnswer is one answer, drawn in the loop (the rng is the loop's own).
type plannedAnswer struct {
	who  answerer
	verb string
	req  protocol.RequestAnswerRequest
	// budgetOf and raise are a budget pause's raise (verb verbRaise): the
	// session whose ledger refused, and by how much to raise each limit
	// (only the limits its ledger names are raised).
	budgetOf string
	raise    protocol.BudgetSpend
}

// verbRaise is a planned answer to a budget pause that raises the ledger
// that refused (budget.raise, docs/protocol.md §5.5 "Pause and raise")
// instead of answering the request: the raise answers it approved.
const verbRaise = "raise"

// raisesPerLedgerMax bounds the raises of one ledger: past it, its pauses
// are denied, and its child gets no more followups (Workload.capped). A
// continuable child the workload keeps sending followups would otherwise
// be raised without end.
const raisesPerLedgerMax = 4

// budgetRaise draws a raise: every limit by several turns' worth (the
// scripted model's turns take tens of tokens; a continuable child's grow
// with its history, each turn's input holding every turn before it).
func budgetRaise(rng *rand.Rand) protocol.BudgetSpend {
	return protocol.BudgetSpend{Tokens: 500 + rng.Int63n(2500), ModelRequests: 2 + rng.Int63n(7),
		ToolCalls: 1 + rng.Int63n(4), Children: 1 + rng.Int63n(3)}
}

// planBudgetAnswer draws the answer to a budget pause: a raise of the
// ledger that refused (one in two), or a denial, which ends the turn
// BUDGET_EXHAUSTED (an approval without a raise would only pause it again).
func planBudgetAnswer(rng *rand.Rand, rec protocol.RequestRecord, who answerer) plannedAnswer {
	req := protocol.RequestAnswerRequest{RequestID: rec.ID, Authority: who.auth}
	if rng.Intn(2) == 0 {
		return plannedAnswer{who: who, verb: verbRaise, req: req, budgetOf: rec.BudgetOf, raise: budgetRaise(rng)}
	}
	req.Answer, req.Reason = protocol.AnswerDeny, "no raise from "+who.name
	return plannedAnswer{who: who, verb: req.Answer, req: req}
}

// requestsAnsweredMax bounds the requests one answer action answers.
const requestsAnsweredMax = 4

// answerRequests lists pending requests with the client's grant, those of
// one of its roots' trees or (one in two) all the user's, and answers up
// to requestsAnsweredMax of them: one in eight is left alone (it may time
// out), one in three gets two answers at once from two authorities (the
// root's credential, an ancestor's, when the list is its tree's; the
// client's grant; another client's grant), of which exactly one may be
// taken. One action in five on a root's tree also answers one with another
// root's credential, which must be refused (I4).
func (c *wclient) answerRequests(ctx context.Context) {
	r := c.pickRoot()
	g := c.userGrant()
	if r == nil || g == "" {
		return
	}
	tree := c.rng.Intn(2) == 0
	req := protocol.RequestsListRequest{Authority: protocol.Authority{Grant: g}}
	if tree {
		req.Under = r.id
	}
	var list protocol.RequestsListReply
	if err := c.call(protocol.EpRequestsList, req, &list); err != nil {
		return
	}
	whos := []answerer{{"grant:" + c.name, protocol.Authority{Grant: g}}}
	if tree {
		ref := r.ref
		whos = append(whos, answerer{r.id, protocol.Authority{Parent: &ref}})
	}
	other := c.w.clients[(c.idx+1)%len(c.w.clients)]
	if og := other.userGrant(); other != c && og != "" {
		whos = append(whos, answerer{"grant:" + other.name, protocol.Authority{Grant: og}})
	}
	var plans [][]plannedAnswer
	for i, rec := range list.Requests {
		if i == requestsAnsweredMax {
			break
		}
		if c.rng.Intn(8) == 0 {
			continue
		}
		k := 1
		if c.rng.Intn(3) == 0 && len(whos) > 1 {
			k = 2
		}
		var group []plannedAnswer
		for _, j := range c.rng.Perm(len(whos))[:k] {
			group = append(group, c.planAnswer(rec, whos[j]))
		}
		plans = append(plans, group)
	}
	if tree && len(list.Requests) > 0 && c.rng.Intn(5) == 0 {
		c.foreignAnswer(r, list.Requests[0])
	}
	for _, group := range plans {
		var wg sync.WaitGroup
		for _, p := range group {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.answer(r, tree, p)
			}()
		}
		wg.Wait()
	}
}

// planAnswer draws an answer to rec by who: an approval approved (three in
// four) or denied with a reason; a question answered with one of its
// choices, or with free text; a budget pause raised or denied
// (planBudgetAnswer).
func (c *wclient) planAnswer(rec protocol.RequestRecord, who answerer) plannedAnswer {
	req := protocol.RequestAnswerRequest{RequestID: rec.ID, Authority: who.auth}
	switch {
	case rec.Kind == protocol.RequestQuestion && len(rec.Choices) > 0:
		req.Answer, req.Text = protocol.AnswerAnswer, rec.Choices[c.rng.Intn(len(rec.Choices))]
	case rec.Kind == protocol.RequestQuestion:
		req.Answer, req.Text = protocol.AnswerAnswer, "answered by "+who.name
	case rec.Kind == protocol.RequestBudget:
		return planBudgetAnswer(c.rng, rec, who)
	case c.rng.Intn(4) == 0:
		req.Answer, req.Reason = protocol.AnswerDeny, "denied by "+who.name
	default:
		req.Answer = protocol.AnswerApprove
	}
	return plannedAnswer{who: who, verb: req.Answer, req: req}
}

// answer sends one planned answer (of a request of r's tree when tree),
// recorded as an OpAnswer with the reply's answer id and state when it is
// taken.
func (c *wclient) answer(r *wroot, tree bool, p plannedAnswer) {
	root := ""
	if tree {
		root = r.id
	}
	var err error
	if p.verb == verbRaise {
		err = c.sendRaise(root, p, c.w.cfg.OpTimeout)
	} else {
		err = c.sendAnswer(root, p, c.w.cfg.OpTimeout)
	}
	if p.req.Authority.Parent != nil {
		c.rootGone(r, err)
	}
}

// sendAnswer sends p and records it (root names the op's tree, "" none),
// the call within timeout.
func (c *wclient) sendAnswer(root string, p plannedAnswer, timeout time.Duration) error {
	op := c.invoke(&Op{Kind: OpAnswer, Root: root, Sender: p.who.name, RequestID: p.req.RequestID, Verb: p.verb})
	var rec protocol.RequestRecord
	err := c.callWithin(timeout, protocol.EpRequestsAnswer, p.req, &rec)
	if err == nil {
		c.w.rec.Update(op, func(o *Op) {
			o.Child, o.AnswerState = rec.SessionID, rec.State
			if rec.Answer != nil {
				o.AnswerID = rec.Answer.ID
			}
		})
	}
	c.w.rec.Complete(op, err)
	return err
}

// sendRaise raises p.budgetOf's ledger by p.raise (the limits it names),
// recorded as an OpRaise with the budget requests the raise answered; a
// ledger the workload did not name, or raised raisesPerLedgerMax times
// already, gets p's request denied instead.
func (c *wclient) sendRaise(root string, p plannedAnswer, timeout time.Duration) error {
	raise, ok := c.w.raisable(p.budgetOf, p.raise)
	if !ok {
		p.verb, p.req.Answer, p.req.Reason = protocol.AnswerDeny, protocol.AnswerDeny, "no more raises from "+p.who.name
		return c.sendAnswer(root, p, timeout)
	}
	op := c.invoke(&Op{Kind: OpRaise, Root: root, Sender: p.who.name, Child: p.budgetOf, RequestID: p.req.RequestID, Verb: verbRaise,
		Budget: &protocol.Budget{Tokens: raise.Tokens, ModelRequests: raise.ModelRequests, ToolCalls: raise.ToolCalls, Children: raise.Children}})
	var reply protocol.BudgetRaiseReply
	err := c.callWithin(timeout, protocol.EpBudgetRaise, protocol.BudgetRaiseRequest{ChildID: p.budgetOf, Authority: p.who.auth, Raise: raise}, &reply)
	if err == nil {
		c.w.rec.Update(op, func(o *Op) { o.Targets = reply.Resumed })
	}
	c.w.rec.Complete(op, err)
	return err
}

// noteBudget records the budget a start named for child id (nil: none).
func (w *Workload) noteBudget(id string, b *protocol.Budget) {
	if b == nil || id == "" {
		return
	}
	w.mu.Lock()
	w.budgets[id] = *b
	w.mu.Unlock()
}

// uncapped returns the children of all that are not capped.
func (w *Workload) uncapped(all []*wchild) []*wchild {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := all[:0:0]
	for _, ch := range all {
		if !w.capped[ch.id] {
			out = append(out, ch)
		}
	}
	return out
}

// raisable returns the part of raise that ledger id's limits name, and
// counts the raise; false when the workload named no such budget, it names
// no limit a raise lifts (a deadline only), or it was raised
// raisesPerLedgerMax times (its child is capped from then on).
func (w *Workload) raisable(id string, raise protocol.BudgetSpend) (protocol.BudgetSpend, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	b, ok := w.budgets[id]
	if ok && w.raises[id] >= raisesPerLedgerMax {
		w.capped[id] = true
	}
	if !ok || w.capped[id] {
		return protocol.BudgetSpend{}, false
	}
	var out protocol.BudgetSpend
	if b.Tokens > 0 {
		out.Tokens = raise.Tokens
	}
	if b.ModelRequests > 0 {
		out.ModelRequests = raise.ModelRequests
	}
	if b.ToolCalls > 0 {
		out.ToolCalls = raise.ToolCalls
	}
	if b.Children > 0 {
		out.Children = raise.Children
	}
	if out.IsZero() {
		return out, false
	}
	w.raises[id]++
	return out, true
}

// foreignAnswer answers rec, a request of r's tree, with the credential of
// another live root: no ancestor of the asking session, so it must be
// refused (UNAUTHORIZED) and change nothing.
func (c *wclient) foreignAnswer(r *wroot, rec protocol.RequestRecord) {
	c.w.mu.Lock()
	all := append([]*wroot(nil), c.w.roots...)
	c.w.mu.Unlock()
	var other *wroot
	for _, i := range c.rng.Perm(len(all)) {
		if all[i] != r && !all[i].closed.Load() {
			other = all[i]
			break
		}
	}
	if other == nil {
		return
	}
	ref := other.ref
	op := c.invoke(&Op{Kind: OpForeign, ForeignKind: "answer-other-root", Sender: other.id, Root: r.id, Child: rec.SessionID, RequestID: rec.ID, Verb: protocol.AnswerApprove})
	err := c.call(protocol.EpRequestsAnswer, protocol.RequestAnswerRequest{
		RequestID: rec.ID, Authority: protocol.Authority{Parent: &ref}, Answer: protocol.AnswerApprove,
	}, &protocol.RequestRecord{})
	c.w.rec.Complete(op, err)
}

// answerSweepInterval is how often answerPending and answerBudgetPauses
// list the pending requests.
const answerSweepInterval = 300 * time.Millisecond

// sweepCallTimeout bounds each call of the sweeps (not OpTimeout's 20 s:
// a call stuck in a fault must not hold every pause past its 8 s timeout),
// and sweepAnswersMax the answers one sweep sends at once.
const (
	sweepCallTimeout = 4 * time.Second
	sweepAnswersMax  = 8
)

// answerBudgetPauses answers every budget pause the first client's grant
// sees (a raise or a denial, planBudgetAnswer), again every
// answerSweepInterval until ctx ends: the workload runs it beside the
// loops, so a paused turn waits about one interval, not the request
// timeout, and the followups queued behind it are processed within L1's
// bound. The loops answer budget pauses too, racing it (one answer wins).
func (w *Workload) answerBudgetPauses(ctx context.Context) {
	rng := rand.New(rand.NewSource(w.cfg.Seed*1000 + 999))
	for ctx.Err() == nil {
		w.sweepRequests(ctx, rng, true, nil)
		select {
		case <-ctx.Done():
		case <-time.After(answerSweepInterval):
		}
	}
}

// answerPending answers every pending request the first client's grant
// sees (approvals approved, questions answered, budget pauses raised or
// denied), again every answerSweepInterval until ctx ends, keeping in
// last when the latest answer or raise sent completed (AnswerPending).
func (w *Workload) answerPending(ctx context.Context, last *atomic.Int64) {
	rng := rand.New(rand.NewSource(w.cfg.Seed*1000 + 998))
	for ctx.Err() == nil {
		w.sweepRequests(ctx, rng, false, last)
		select {
		case <-ctx.Done():
		case <-time.After(answerSweepInterval):
		}
	}
}

// sweepRequests lists the pending requests with the first client's grant
// and answers each (budget pauses only, when budgetOnly), up to
// sweepAnswersMax at once, each call within sweepCallTimeout; it keeps in
// last (when not nil) when the latest answer or raise it sent completed
// (Unix ms).
func (w *Workload) sweepRequests(ctx context.Context, rng *rand.Rand, budgetOnly bool, last *atomic.Int64) {
	c := w.clients[0]
	g := c.userGrant()
	if g == "" {
		return
	}
	var list protocol.RequestsListReply
	if err := c.callWithin(sweepCallTimeout, protocol.EpRequestsList, protocol.RequestsListRequest{Authority: protocol.Authority{Grant: g}}, &list); err != nil {
		return
	}
	who := answerer{"grant:" + c.name, protocol.Authority{Grant: g}}
	var plans []plannedAnswer
	for _, rec := range list.Requests {
		switch {
		case rec.Kind == protocol.RequestBudget:
			plans = append(plans, planBudgetAnswer(rng, rec, who))
		case budgetOnly:
		case rec.Kind == protocol.RequestQuestion:
			req := protocol.RequestAnswerRequest{RequestID: rec.ID, Authority: who.auth, Answer: protocol.AnswerAnswer, Text: "yes"}
			plans = append(plans, plannedAnswer{who: who, verb: req.Answer, req: req})
		default:
			req := protocol.RequestAnswerRequest{RequestID: rec.ID, Authority: who.auth, Answer: protocol.AnswerApprove}
			plans = append(plans, plannedAnswer{who: who, verb: req.Answer, req: req})
		}
	}
	slots := make(chan struct{}, sweepAnswersMax)
	var wg sync.WaitGroup
	for _, p := range plans {
		if ctx.Err() != nil {
			break
		}
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			if p.verb == verbRaise {
				_ = c.sendRaise("", p, sweepCallTimeout)
			} else {
				_ = c.sendAnswer("", p, sweepCallTimeout)
			}
			for now := time.Now().UnixMilli(); last != nil; {
				if prev := last.Load(); prev >= now || last.CompareAndSwap(prev, now) {
					break
				}
			}
		}()
	}
	wg.Wait()
}
