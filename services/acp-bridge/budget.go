package acpbridge

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/requestwait"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/provider"
)

// Budgets (docs/protocol.md §5.5, "Budgets"; issue 32, items 2 and 5): an
// ACP child's turn is one model request (the agent plays the model), so a
// child that draws on budgets reserves one before its prompt is sent —
// before its agent is even started on a first turn — and settles it when
// the turn ends, as the agent runtime does for each of its steps:
//
//   - a one-shot child whose own budget is the only one it draws on has its
//     first turn's reservation taken by the coordinator at admission
//     (SessionHeader.BudgetStartTokens, id the session's): that turn uses
//     it;
//   - otherwise the reservation wants one model request and a token estimate (one
//     token per two bytes of the prompt's text plus
//     agent.BudgetOutputTokensReserve), at least one token free, and takes
//     what is free without waiting for other reservations (NoWait): an ACP
//     agent cannot be told a bound on its answer, so a smaller grant does
//     not cut it;
//   - a refusal ends the turn before the prompt, `error` with the
//     refusal's code (BUDGET_EXHAUSTED at the cap), nothing logged of a
//     step; but a continuable child at its cap pauses (below);
//   - the settlement charges one model request and the tokens the agent
//     reported for the turn (PromptResponse.usage); when it reported none
//     the whole grant is charged, an unknown never being zero. A turn that
//     never sent its prompt charges nothing. Reported tokens past the
//     grant are charged as reported: an ACP agent's tokens are outside the
//     bound of §5.5 by what it spent past its grant.
//
// Pause and raise (docs/protocol.md §5.5; issue 32, item 3): a continuable
// child whose reservation is refused BUDGET_EXHAUSTED on a limit a raise
// lifts (requestwait.PausesAtCap: never the deadline) pauses before its
// prompt, as a built-in agent pauses before a model request: the turn
// opens a request of kind budget for its step 1 (requestwait.BudgetRequest)
// and parks on it (park), request/open logged in the open turn before any
// step, so continuable.state (BudgetPause) and children.list
// (sessionlog.Parked) say paused; it holds no reservation, and a resident
// agent process stays, idle (nothing is sent to it). A raise (budget.raise
// answers the request approved) and the turn reserves again and prompts:
// the same turn, one turn end. A denial or the request's timeout ends the
// turn BUDGET_EXHAUSTED (requestwait.BudgetPauseEnd); the budget's
// deadline passing meanwhile ends it with the deadline's reason
// (ctxEnding). The pause happens between prompts only: an ACP agent
// cannot be held inside one, so what it spends past its grant within a
// prompt is charged as reported, and the next prompt's reservation is the
// one refused. A bridge that stops while the turn is paused leaves the
// turn open (sessionlog.Parked); the session's next activation waits on
// the same request again (ContinueParked), then reserves and prompts
// (starting the agent, or loading its ACP session, first).

// turnGrant is the reservation an ACP turn holds ("" id: none).
type turnGrant struct {
	id     string
	tokens int64
}

// budgeted reports whether the session draws on budgets it can reserve on.
func (s *Session) budgeted() bool {
	return s.o.Budget != nil && len(s.header.Budgets) > 0
}

// reserveTurn reserves the turn's model request on the session's budgets
// (nil: reserved, or nothing to reserve); the error is the reservation's
// refusal or failure.
func (s *Session) reserveTurn(ctx context.Context, prompt string) error {
	if !s.budgeted() {
		return nil
	}
	s.mu.Lock()
	if g := s.header.BudgetStartTokens; g > 0 && s.turn == 1 && !s.startGrantUsed {
		// The coordinator reserved the first turn at admission (id: the
		// session's): it is this turn's grant.
		s.startGrantUsed = true
		s.grant = turnGrant{id: s.header.ID, tokens: g}
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	want := protocol.BudgetSpend{ModelRequests: 1, Tokens: int64(len(prompt))/2 + agent.BudgetOutputTokensReserve}
	rctx, cancel := context.WithTimeout(ctx, agent.BudgetCallTimeout)
	defer cancel()
	rep, err := s.o.Budget.ReserveBudget(rctx, protocol.BudgetReserveRequest{
		Self: protocol.ParentRef{SessionID: s.header.ID, Credential: s.cred}, Want: want, TokensMin: 1, NoWait: true,
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.grant = turnGrant{id: rep.ReservationID, tokens: rep.Granted.Tokens}
	s.mu.Unlock()
	return nil
}

// pausesAtCap reports whether the refused reservation err pauses the turn
// rather than ending it: the session is a continuable child's that can
// ask (Options.Requests), and the limit is one a raise lifts.
func (s *Session) pausesAtCap(err error) bool {
	return s.continuable && s.o.Requests != nil && requestwait.PausesAtCap(err)
}

// reservePausing reserves turn's model request (reserveTurn), pausing at
// the budget's cap until a raise (budgetPause), and returns how the turn
// ends when it got no reservation (nil: reserved, or nothing to
// reserve). parked, when set, is the pause the session's previous host
// logged: the turn waits on it first.
func (s *Session) reservePausing(ctx context.Context, turn int64, prompt string, parked *protocol.RequestOpenData) *ending {
	if parked != nil {
		if e := s.budgetPause(ctx, turn, nil, parked); e != nil {
			return e
		}
	}
	err := s.reserveTurn(ctx, prompt)
	for err != nil && ctx.Err() == nil && s.pausesAtCap(err) {
		if e := s.budgetPause(ctx, turn, err, nil); e != nil {
			return e
		}
		err = s.reserveTurn(ctx, prompt)
	}
	if err == nil {
		return nil
	}
	if e := s.ctxEnding(ctx); e != nil {
		return e
	}
	code := protocol.CodeOf(err)
	if code == "" {
		code = protocol.CodeUnavailable
	}
	return &ending{reason: errReason(code, "no budget reservation: "+err.Error())}
}

// budgetPause parks turn, before its prompt, on a request of kind budget
// (parked, when set, is the one the previous host logged; refused is the
// reservation's BUDGET_EXHAUSTED otherwise) and returns how the turn ends,
// nil when the request was approved (a raise): the turn reserves again.
func (s *Session) budgetPause(ctx context.Context, turn int64, refused error, parked *protocol.RequestOpenData) *ending {
	const step = 1 // an ACP turn is one step, not started yet
	var req protocol.RequestOpenRequest
	if parked != nil {
		req = protocol.RequestOpenRequest{Kind: protocol.RequestBudget, Turn: turn, Step: parked.Step, CallID: parked.CallID}
	} else {
		s.mu.Lock()
		req = requestwait.BudgetRequest(turn, step, requestwait.BudgetRequests(s.events, turn, step), refused)
		s.mu.Unlock()
	}
	id := protocol.RequestID(s.header.ID, req.CallID)
	defer s.notePaused(nil)
	// The pause's records are the turn's own, between its opening and
	// its step: each is appended at once (no writer runs yet).
	var failed *provider.Outcome
	record := func(typ string, data any) error {
		var b evBuf
		b.add(typ, data)
		if b.err != nil {
			return b.err
		}
		s.logMu.Lock()
		out, ok := s.append(ctx, turn, b.evs)
		s.logMu.Unlock()
		if !ok {
			failed = &out
			if out.Err != nil {
				return out.Err
			}
			return provider.ErrFenced
		}
		return nil
	}
	// The budget's deadline ends the pause where it passes, whether or
	// not a coordinator's sweep ended the subtree first.
	pctx := ctx
	if at := s.header.BudgetDeadlineAt; at > 0 {
		var cancel context.CancelFunc
		pctx, cancel = context.WithDeadlineCause(ctx, time.UnixMilli(at), errBudgetDeadline)
		defer cancel()
	}
	rec, d, stage, err := s.park(pctx, req, parked, record, func(open protocol.RequestOpenData) {
		s.logger.Info("the turn pauses at its budget's cap until the budget is raised", "turn", turn, "request", open.RequestID, "again", parked != nil)
		s.notePaused(&open)
	})
	exhausted := rec.Exhausted
	if exhausted == "" {
		exhausted = req.Exhausted
	}
	switch {
	case failed != nil && failed.Fenced:
		return &ending{fenced: true}
	case failed != nil:
		return &ending{reason: failed.Reason, err: failed.Err}
	case stage == parkEnded && ctx.Err() == nil && errors.Is(context.Cause(pctx), errBudgetDeadline):
		return &ending{reason: errReason(protocol.CodeBudgetExhausted, fmt.Sprintf("the budget's deadline passed at %s while the turn was paused for a raise (request %s)",
			time.UnixMilli(s.header.BudgetDeadlineAt).UTC().Format(time.RFC3339Nano), id))}
	case stage == parkEnded && ctx.Err() != nil:
		// Disposed, interrupted, or the budget's deadline passed
		// (ctxEnding says which); no prompt is in flight.
		e := s.ctxEnding(ctx)
		e.cancelRemote = false
		return e
	case stage != 0:
		return &ending{reason: errReason(protocol.CodeBudgetExhausted, requestwait.BudgetPauseFailed(exhausted, id, err))}
	}
	if raised, diag := requestwait.BudgetPauseEnd(exhausted, rec.ID, d); !raised {
		return &ending{reason: errReason(protocol.CodeBudgetExhausted, diag)}
	}
	s.logger.Info("the budget was raised; the turn reserves again", "turn", turn, "request", rec.ID)
	return nil
}

// errBudgetDeadline is the cause of a pause that ended at the budget's
// deadline (SessionHeader.BudgetDeadlineAt).
var errBudgetDeadline = errors.New("acp: the budget's deadline passed")

// notePaused shows d as the budget request the open turn waits on (nil:
// none; BudgetPause).
func (s *Session) notePaused(d *protocol.RequestOpenData) {
	s.mu.Lock()
	s.paused = d
	s.mu.Unlock()
}

// BudgetPause returns the budget request the running turn is paused on (a
// copy), nil when it is not paused at its budget's cap; continuable.state
// shows it as state paused (docs/protocol.md §5.10). Safe for concurrent
// use.
func (s *Session) BudgetPause() *protocol.RequestOpenData {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.paused == nil {
		return nil
	}
	d := *s.paused
	return &d
}

// ParkedTurn reports whether the session's log ends in a turn paused at
// its budget's cap (sessionlog.Parked with Budget, before the turn's
// step): ContinueParked continues it. A turn parked on a permission
// request is not one (its agent process, which asked, is gone): it is
// closed interrupted, as any turn a stopped host left open.
func (s *Session) ParkedTurn() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.parkedPause()
	return ok
}

// parkedPause returns the budget pause the log's open turn waits on
// (Session.mu held).
func (s *Session) parkedPause() (sessionlog.ParkedStep, bool) {
	p, ok := sessionlog.Parked(s.events)
	return p, ok && p.Budget != nil && len(p.Pending) == 0
}

// ContinueParked continues the turn the log left paused at its budget's
// cap (ParkedTurn) and runs it to its end, as RunSteps does: it waits on
// the same budget request, then reserves and prompts with the turn's
// user message (docs/protocol.md §5.5, "Pause and raise"). With no such
// turn it returns the zero Outcome and logs nothing.
func (s *Session) ContinueParked(ctx context.Context) provider.Outcome {
	s.mu.Lock()
	p, ok := s.parkedPause()
	if ok {
		s.turn = p.Turn
		s.prompt, s.source = nil, protocol.MessageSource{}
		if m, found := turnMessage(s.events, p.Turn); found {
			s.prompt, s.source = acpPrompt(m.Content), m.Source
		}
	}
	s.mu.Unlock()
	if !ok {
		return provider.Outcome{}
	}
	s.logger.Info("continuing a turn paused at its budget's cap", "turn", p.Turn, "request", p.Budget.RequestID)
	return s.runTurn(ctx, p.Budget)
}

// turnMessage returns the user/message of turn turn in events.
func turnMessage(events []protocol.SessionEvent, turn int64) (protocol.UserMessageData, bool) {
	for i := len(events) - 1; i >= 0; i-- {
		var d protocol.UserMessageData
		if events[i].Type == protocol.EvUserMessage && events[i].Decode(&d) == nil && d.Turn == turn {
			return d, true
		}
	}
	return protocol.UserMessageData{}, false
}

// settleTurn settles the turn's reservation, if it holds one: prompted says
// whether the prompt was sent, usage what the agent reported (nil: none).
// A failed settle leaves the reservation to be charged in full once the
// run settles.
func (s *Session) settleTurn(ctx context.Context, prompted bool, usage *protocol.Usage) {
	s.mu.Lock()
	g := s.grant
	s.grant = turnGrant{}
	s.mu.Unlock()
	if g.id == "" {
		return
	}
	var used protocol.BudgetSpend
	if prompted {
		used = protocol.BudgetSpend{ModelRequests: 1, Tokens: g.tokens}
		if t, ok := usage.BudgetTokens(); ok {
			used.Tokens = t
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), agent.BudgetCallTimeout)
	defer cancel()
	err := s.o.Budget.SettleBudget(sctx, protocol.BudgetSettleRequest{
		Self: protocol.ParentRef{SessionID: s.header.ID, Credential: s.cred}, ReservationID: g.id, Used: used,
	})
	if err != nil {
		s.logger.Warn("a budget reservation was not settled; it is charged in full once the run settles", "reservation", g.id, "err", err)
	}
}

// promptText is the text of a prompt's blocks, for its token estimate.
func promptText(prompt []acp.ContentBlock) string {
	var b strings.Builder
	for _, c := range prompt {
		if c.Text != nil {
			b.WriteString(c.Text.Text)
		}
	}
	return b.String()
}
