package acpbridge

import (
	"context"
	"strings"

	acp "github.com/coder/acp-go-sdk"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/pkg/protocol"
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
//     step;
//   - the settlement charges one model request and the tokens the agent
//     reported for the turn (PromptResponse.usage); when it reported none
//     the whole grant is charged, an unknown never being zero. A turn that
//     never sent its prompt charges nothing. Reported tokens past the
//     grant are charged as reported: an ACP agent's tokens are outside the
//     bound of §5.5 by what it spent past its grant.

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
// (nil ending: reserved, or nothing to reserve).
func (s *Session) reserveTurn(ctx context.Context, prompt string) *ending {
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
		if e := s.ctxEnding(ctx); e != nil {
			return e
		}
		code := protocol.CodeOf(err)
		if code == "" {
			code = protocol.CodeUnavailable
		}
		return &ending{reason: errReason(code, "no budget reservation: "+err.Error())}
	}
	s.mu.Lock()
	s.grant = turnGrant{id: rep.ReservationID, tokens: rep.Granted.Tokens}
	s.mu.Unlock()
	return nil
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
