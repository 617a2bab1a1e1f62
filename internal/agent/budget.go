package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Budgeter reserves and settles a budgeted session's spend on the budgets
// its header lists (budget.reserve and budget.settle, docs/protocol.md
// §5.22); *client.Client is the production one.
type Budgeter interface {
	ReserveBudget(ctx context.Context, req protocol.BudgetReserveRequest) (protocol.BudgetReserveReply, error)
	SettleBudget(ctx context.Context, req protocol.BudgetSettleRequest) error
}

// Budget reservation bounds (docs/protocol.md §5.5, "Budgets").
const (
	// BudgetOutputTokensReserve is the answer bound a model request
	// reserves when its request names none (model.Request.MaxTokens 0):
	// the request reserves its input estimate plus this, or what the
	// budget has left, and its answer is bounded to the output part of the
	// grant.
	BudgetOutputTokensReserve int64 = 4096
	// BudgetCallTimeout bounds one reserve or settle call, its retries
	// included.
	BudgetCallTimeout = 10 * time.Second
	// BudgetWaitMax bounds how long a model request waits for tokens held
	// by other sessions' reservations in flight before it takes what is
	// free (at least its input estimate and one token) or ends
	// BUDGET_EXHAUSTED (a continuable child then pauses). The coordinator
	// asks it to wait only while another session's reservation holds
	// tokens (docs/protocol.md §5.5, "The reservation rule"); a step waits
	// it once, not once for its turn's prefetch and again for itself.
	BudgetWaitMax = 10 * time.Second
	// budgetBackoffMax bounds the wait between two asks.
	budgetBackoffMax = 500 * time.Millisecond
)

// errBudgetDeadline is the cause of a turn cut at its budget's deadline.
var errBudgetDeadline = errors.New("budget deadline")

// grant is a reservation taken for one step.
type grant struct {
	id     string
	tokens int64 // granted
	in     int64 // the input estimate it was taken for
	capped bool  // the grant bounds the answer below what was wanted
	// atAdmission: taken by the coordinator at the child's admission
	// (SessionHeader.BudgetStartTokens); capped is decided when it is used.
	atAdmission bool
}

// apply bounds req, whose input estimate is in (at most g.in), to g: its
// answer gets the grant's tokens less its input.
func (g grant) apply(req *model.Request, in int64) {
	if g.id != "" {
		req.MaxTokens = g.tokens - in
	}
}

// prefetched is a first step's reservation taken while its turn opening
// was being logged (prefetch).
type prefetched struct {
	g   grant
	err error
}

// prefetch starts reserving the first model request of the turn that in
// opens, beside the opening's log append (so the reservation is off the
// turn's path): its request is the history, in's message and the tools.
// The first step takes it when its real request's input estimate is no
// larger (takeReservation).
func (a *Agent) prefetch(ctx context.Context, content []protocol.ContentBlock) {
	if !a.budgeted() {
		return
	}
	if g := a.cfg.Header.BudgetStartTokens; g > 0 && a.noOwnTurn() {
		// The coordinator took it at admission (id: the session's): any
		// request whose input estimate leaves one token for its answer
		// fits it.
		ch := make(chan prefetched, 1)
		ch <- prefetched{g: grant{id: a.cfg.Header.ID, tokens: g, in: g - 1, atAdmission: true}}
		a.prefetched = ch
		return
	}
	a.mu.Lock()
	history, err := a.index.Messages()
	a.mu.Unlock()
	if err != nil {
		return
	}
	req := model.Request{System: a.cfg.System, Messages: append(history, model.Message{Role: model.RoleUser, Content: content}), Tools: a.cfg.Tools.Specs()}
	ch := make(chan prefetched, 1)
	a.prefetched = ch
	go func() {
		g, err := a.reserveModel(ctx, &req)
		ch <- prefetched{g, err}
	}()
}

// dropPrefetch releases a prefetched reservation the turn will not use.
func (a *Agent) dropPrefetch(ctx context.Context) {
	if ch := a.prefetched; ch != nil {
		a.prefetched = nil
		if p := <-ch; p.err == nil {
			a.settle(ctx, p.g, protocol.BudgetSpend{})
		}
	}
}

// takeReservation reserves the step's model request: the prefetched
// reservation when there is one that covers req's input estimate, else a
// new one (reserveModel).
func (a *Agent) takeReservation(ctx context.Context, req *model.Request) (grant, error) {
	if ch := a.prefetched; ch != nil {
		a.prefetched = nil
		p := <-ch
		if protocol.CodeOf(p.err) == protocol.CodeBudgetExhausted {
			// The prefetch waited out BudgetWaitMax already: the step
			// asks once more without waiting, then pauses or ends.
			return a.reserveModelWait(ctx, req, false)
		}
		if p.err == nil {
			if in := model.EstimateInputTokens(a.cfg.Model, *req); p.g.id == "" || in <= p.g.in {
				if p.g.atAdmission {
					p.g.capped = p.g.tokens < in+outputBound(*req)
				}
				p.g.apply(req, in)
				return p.g, nil
			}
			a.settle(ctx, p.g, protocol.BudgetSpend{}) // taken for less than the request needs
		}
	}
	return a.reserveModel(ctx, req)
}

// budgeted reports whether the session draws on a budget it must reserve on.
func (a *Agent) budgeted() bool {
	return a.cfg.Budget != nil && len(a.cfg.Header.Budgets) > 0
}

func (a *Agent) self() protocol.ParentRef {
	return protocol.ParentRef{SessionID: a.cfg.Header.ID, Credential: a.cfg.Credential}
}

// reserveModel reserves one model request and its tokens before req is
// sent: the input estimate (model.EstimateInputTokens) plus the answer's
// bound (req.MaxTokens, else BudgetOutputTokensReserve), at least the
// estimate and one output token. A grant below that bounds the answer
// (req.MaxTokens). The error is the turn's end: BUDGET_EXHAUSTED, or why
// no reservation could be taken.
//
// It first waits for the session's own settlements in flight
// (waitOwnSettles): the coordinator does not tell a session to wait for
// its own reservations, so one not yet settled would be taken as spent.
func (a *Agent) reserveModel(ctx context.Context, req *model.Request) (grant, error) {
	return a.reserveModelWait(ctx, req, true)
}

// reserveModelWait is reserveModel; wait false takes the free tokens at
// once (noWait) rather than ask again for up to BudgetWaitMax.
func (a *Agent) reserveModelWait(ctx context.Context, req *model.Request, wait bool) (grant, error) {
	if !a.budgeted() {
		return grant{}, nil
	}
	if err := a.waitOwnSettles(ctx); err != nil {
		return grant{}, err
	}
	in := model.EstimateInputTokens(a.cfg.Model, *req)
	out := outputBound(*req)
	want := protocol.BudgetReserveRequest{Self: a.self(), Want: protocol.BudgetSpend{Tokens: in + out, ModelRequests: 1}, TokensMin: in + 1}
	waitUntil := time.Now()
	if wait {
		waitUntil = waitUntil.Add(BudgetWaitMax)
	}
	backoff := time.Duration(protocol.BudgetRetryMs) * time.Millisecond
	for {
		want.NoWait = !time.Now().Before(waitUntil)
		rctx, cancel := context.WithTimeout(ctx, BudgetCallTimeout)
		rep, err := a.cfg.Budget.ReserveBudget(rctx, want)
		cancel()
		if err != nil {
			return grant{}, err
		}
		if rep.RetryMs > 0 {
			select {
			case <-ctx.Done():
				return grant{}, context.Cause(ctx)
			case <-time.After(max(backoff, time.Duration(rep.RetryMs)*time.Millisecond)):
			}
			backoff = min(2*backoff, budgetBackoffMax)
			continue
		}
		g := grant{id: rep.ReservationID, tokens: rep.Granted.Tokens, in: in, capped: rep.Granted.Tokens < in+out}
		// The answer is bounded to the grant's output part, so the
		// request spends no more than it reserved (the bound of
		// docs/protocol.md §5.5).
		g.apply(req, in)
		return g, nil
	}
}

// settle settles g with what the step used: resp's reported tokens (the
// whole grant when none were reported: an unknown is never zero), one
// model request. A failed settle leaves the reservation to be charged in
// full once the run settles.
//
// The settle runs beside the step's log append (it is off the step's
// path); the turn waits for its settles before it returns (RunSteps), so a
// run's ledger is settled before the run is, unless its host took that
// wait on itself (OverlapSettles).
func (a *Agent) settle(ctx context.Context, g grant, used protocol.BudgetSpend) {
	if g.id == "" {
		return
	}
	a.settles.Add(1)
	done := make(chan struct{})
	a.settlingMu.Lock()
	a.settling = append(a.settling, done)
	a.settlingMu.Unlock()
	go func() {
		defer a.settles.Done()
		defer close(done)
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), BudgetCallTimeout)
		defer cancel()
		if err := a.cfg.Budget.SettleBudget(sctx, protocol.BudgetSettleRequest{Self: a.self(), ReservationID: g.id, Used: used}); err != nil {
			a.log.Warn("a budget reservation was not settled; it is charged in full once the run settles", "reservation", g.id, "err", err)
		}
	}()
}

// waitOwnSettles waits for the session's budget settlements sent before
// it (each bounded by BudgetCallTimeout), or ctx's end (its cause).
func (a *Agent) waitOwnSettles(ctx context.Context) error {
	a.settlingMu.Lock()
	pending := a.settling[:0:0]
	for _, ch := range a.settling {
		select {
		case <-ch:
		default:
			pending = append(pending, ch)
		}
	}
	a.settling = pending
	pending = slices.Clone(pending)
	a.settlingMu.Unlock()
	for _, ch := range pending {
		select {
		case <-ch:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return nil
}

// OverlapSettles lets the session's turns return their outcome before
// their budget settlements end: a turn does not wait for the ones in
// flight, and the settlement of the step that ends the turn is held until
// WaitSettled sends it (settleLast), off the run's path (each is a ledger
// write; BENCHMARKS.md, "a one-shot run with a budget"). The one-shot host
// sets it before the run's turn, settles and publishes the run, and calls
// WaitSettled before it releases the session's lease: a reservation taken
// at admission is settled by the session's live agent only. A settlement
// that lands after the run settled still charges what the step used: a
// coordinator leaves a settled run's reservations alone for
// settledReservationGrace before it charges them in full
// (services/coordinator/budget.go; docs/protocol.md §5.5, "Budgets").
func (a *Agent) OverlapSettles() { a.overlapSettles.Store(true) }

// WaitSettled sends the settlements held by settleLast and waits for every
// budget settlement in flight; each is bounded by BudgetCallTimeout.
// Called once the turn returned.
func (a *Agent) WaitSettled() {
	a.mu.Lock()
	held := a.lastSettles
	a.lastSettles = nil
	a.mu.Unlock()
	for _, send := range held {
		send()
	}
	a.settles.Wait()
}

// settleLast settles g, the reservation of the step that ends the turn:
// at once, or, when the host overlaps settlements with the run's end
// (OverlapSettles), when it calls WaitSettled.
func (a *Agent) settleLast(ctx context.Context, g grant, used protocol.BudgetSpend) {
	if g.id == "" || !a.overlapSettles.Load() {
		a.settle(ctx, g, used)
		return
	}
	ctx = context.WithoutCancel(ctx)
	a.mu.Lock()
	a.lastSettles = append(a.lastSettles, func() { a.settle(ctx, g, used) })
	a.mu.Unlock()
}

// turnSettled is the end of a turn's steps: it waits for the turn's
// settlements unless the host waits for them (OverlapSettles).
func (a *Agent) turnSettled() {
	if !a.overlapSettles.Load() {
		a.settles.Wait()
	}
}

// modelUsed is what a model request spent against g.
func modelUsed(g grant, usage *protocol.Usage) protocol.BudgetSpend {
	used := protocol.BudgetSpend{ModelRequests: 1, Tokens: g.tokens}
	if t, ok := usage.BudgetTokens(); ok {
		used.Tokens = t
	}
	return used
}

// reserveTools reserves a step's n tool calls.
func (a *Agent) reserveTools(ctx context.Context, n int) (grant, error) {
	if !a.budgeted() || n == 0 {
		return grant{}, nil
	}
	rctx, cancel := context.WithTimeout(ctx, BudgetCallTimeout)
	defer cancel()
	rep, err := a.cfg.Budget.ReserveBudget(rctx, protocol.BudgetReserveRequest{Self: a.self(), Want: protocol.BudgetSpend{ToolCalls: int64(n)}})
	if err != nil {
		return grant{}, err
	}
	return grant{id: rep.ReservationID}, nil
}

// budgetEnd is the turn end of a refused reservation: BUDGET_EXHAUSTED
// with the budget's words, or the code of why none could be taken.
func budgetEnd(err error) protocol.TurnEndReason {
	code := protocol.CodeOf(err)
	if code == "" {
		code = protocol.CodeUnavailable
	}
	return errReason(code, "no budget reservation: "+err.Error())
}

// withBudgetDeadline bounds ctx by the header's budget deadline.
func (a *Agent) withBudgetDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	at := a.cfg.Header.BudgetDeadlineAt
	if at <= 0 {
		return ctx, func() {}
	}
	return context.WithDeadlineCause(ctx, time.UnixMilli(at), errBudgetDeadline)
}

// deadlineEnd is the turn end at the budget's deadline.
func (a *Agent) deadlineEnd() protocol.TurnEndReason {
	return errReason(protocol.CodeBudgetExhausted, fmt.Sprintf("the budget's deadline passed at %s; the turn was cut there",
		time.UnixMilli(a.cfg.Header.BudgetDeadlineAt).UTC().Format(time.RFC3339Nano)))
}

// refuseTools ends the turn when a step's tool calls got no reservation:
// each logged call gets an error result saying so (the log stays
// balanced), and the turn ends with the refusal's code.
func (a *Agent) refuseTools(ctx context.Context, turn, step int64, calls []protocol.ToolCall, err error) Outcome {
	return a.refuseToolsReason(ctx, turn, step, calls, budgetEnd(err))
}

// refuseToolsReason is refuseTools ending the turn with reason.
func (a *Agent) refuseToolsReason(ctx context.Context, turn, step int64, calls []protocol.ToolCall, reason protocol.TurnEndReason) Outcome {
	var b eventBuf
	for _, c := range calls {
		r := ErrorResult("%s: not run: %s", reason.Code, reason.Error)
		b.add(a, protocol.EvToolResult, protocol.ToolResultData{Turn: turn, Step: step, CallID: c.ID, Name: c.Name, Content: r.Content, IsError: true})
	}
	b.add(a, protocol.EvStepEnd, protocol.StepData{Turn: turn, Step: step})
	if ctx.Err() != nil {
		return a.endCancelled(ctx, turn, &b)
	}
	return a.end(ctx, turn, &b, reason)
}

// outputBound is the answer bound a request reserves: its MaxTokens, else
// BudgetOutputTokensReserve.
func outputBound(req model.Request) int64 {
	if req.MaxTokens > 0 {
		return req.MaxTokens
	}
	return BudgetOutputTokensReserve
}

// noOwnTurn reports whether the session has not opened a turn of its own
// yet (no user/message after its seed).
func (a *Agent) noOwnTurn() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	seed := max(a.cfg.Header.SeedLength, 0)
	if int64(len(a.events)) < seed {
		return false
	}
	for _, ev := range a.events[seed:] {
		if ev.Type == protocol.EvUserMessage {
			return false
		}
	}
	return true
}
