// Package agent is Brood's agent runtime (docs/design.md §5): a session's turns and
// steps, its tools, and the rules that read a result out of its log. Every
// turn is durable before it is used: the turn opening (turn/start, the claim,
// the user message) is one log record; each model step is one record (two
// when it calls tools: the calls, then their results); the turn's end joins
// the last step's record.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/provider/contract"
)

// The session contract's types are the provider SDK's (pkg/provider/contract,
// a leaf the host framework and providers outside the module share); the
// runtime names them here.
type (
	// Appender writes a session's log; *store.LogWriter is the production
	// one. Append returns the events with their seqs, an error wrapping
	// store.ErrFenced (contract.ErrFenced) when another writer owns the log,
	// or a LIMIT_EXCEEDED error for an oversized record.
	Appender = contract.Appender
	// Cancel is the cause given to a turn's context when its owner stops
	// it; the turn ends aborted{cause}.
	Cancel = contract.Cancel
	// Input is one turn's input: a user message, optionally claimed from
	// the inbox (InboxSeq > 0, logged as agent/inbox/dequeue before it is
	// used).
	Input = contract.Input
	// Outcome is how a turn ended: Fenced means the agent lost its log to
	// another writer and must be dropped without publishing anything; Err
	// is a log append JetStream did not acknowledge (DURABILITY_FAILED).
	Outcome = contract.Outcome
)

// Limits bound one agent's work. Zero fields take the defaults of DefaultLimits.
type Limits struct {
	// TurnTimeout bounds a whole turn (default 10 minutes, docs/design.md §4).
	TurnTimeout time.Duration
	// StepsPerTurnMax bounds the model calls of one turn (default 64).
	StepsPerTurnMax int
	// ToolCallsPerStepMax bounds the tool calls of one assistant message (default 32).
	ToolCallsPerStepMax int
	// ToolOutputBytesMax bounds one tool result's text (default 512 KiB);
	// larger output is refused with a LIMIT_EXCEEDED error result, never cut.
	ToolOutputBytesMax int
	// AppendTimeout bounds each log append, its retries through transient
	// JetStream failures included (default store.SettleBudget, 60 s). A
	// failed append ends the turn in error and the run or epoch
	// DURABILITY_FAILED, so it waits out a leader election as long as the
	// run's settlement would: at 10 s, elections of BROOD_LOG on a loaded
	// cluster failed runs that only had to wait (issue 9).
	AppendTimeout time.Duration
	// ModelRetryBackoff is the pause of the turn before the first retry of
	// a model request that failed temporarily (model.Error.Retryable),
	// doubled for each further retry up to ModelRetryBackoffMax (default
	// 500 ms); each pause is drawn from its second half at random (jitter)
	// unless the endpoint's Retry-After decided it. Retries go on until the model answers, fails for good, or
	// the turn's deadline passes (modelretry.go).
	ModelRetryBackoff time.Duration
	// ModelRetryBackoffMax caps that doubling pause (default 30 s).
	ModelRetryBackoffMax time.Duration
	// ModelRetryAfterMax caps how long an endpoint's Retry-After may make a
	// pause (default 60 s): the pause is the larger of the backoff and the
	// Retry-After so capped.
	ModelRetryAfterMax time.Duration
}

// DefaultLimits are the documented defaults.
func DefaultLimits() Limits {
	return Limits{
		TurnTimeout:         defaultTurnTimeout,
		StepsPerTurnMax:     int(protocol.DefaultStepsPerTurnMax),
		ToolCallsPerStepMax: int(protocol.DefaultToolCallsPerStepMax),
		ToolOutputBytesMax:  512 << 10,
		AppendTimeout:       store.SettleBudget,

		ModelRetryBackoff:    modelRetryBackoffDefault,
		ModelRetryBackoffMax: modelRetryBackoffMaxDefault,
		ModelRetryAfterMax:   modelRetryAfterMaxDefault,
	}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.TurnTimeout <= 0 {
		l.TurnTimeout = d.TurnTimeout
	}
	if l.StepsPerTurnMax <= 0 {
		l.StepsPerTurnMax = d.StepsPerTurnMax
	}
	if l.ToolCallsPerStepMax <= 0 {
		l.ToolCallsPerStepMax = d.ToolCallsPerStepMax
	}
	if l.ToolOutputBytesMax <= 0 {
		l.ToolOutputBytesMax = d.ToolOutputBytesMax
	}
	if l.AppendTimeout <= 0 {
		l.AppendTimeout = d.AppendTimeout
	}
	if l.ModelRetryBackoff <= 0 {
		l.ModelRetryBackoff = d.ModelRetryBackoff
	}
	if l.ModelRetryBackoffMax <= 0 {
		l.ModelRetryBackoffMax = d.ModelRetryBackoffMax
	}
	if l.ModelRetryAfterMax <= 0 {
		l.ModelRetryAfterMax = d.ModelRetryAfterMax
	}
	return l
}

// Config builds an Agent.
type Config struct {
	Header protocol.SessionHeader
	Log    Appender
	// Events are the session's existing events (a seed, or the log read on
	// resume); the next appended event continues their seqs.
	Events     []protocol.SessionEvent
	Model      model.Model
	Tools      *Registry
	System     string
	Credential string
	Limits     Limits
	Logger     *slog.Logger
	// Now returns the time (tests); default time.Now.
	Now func() time.Time
	// Inbox, when set, lets next-step items (settlement notices, reports)
	// join a running turn at its next step; InboxDirty reports (and clears)
	// whether anything arrived since the last look, nil meaning always look.
	Inbox      Inbox
	InboxDirty func() bool
	// Metrics, when set, counts the agent's model and tool calls.
	Metrics *telemetry.Metrics
	// Requests, when set, lets a call to a tool that needs approval, or to
	// the ask tool, park on a request until it is answered (requests.go,
	// docs/protocol.md §5.21); unset, such a call is an error result at
	// once.
	Requests Requester
	// Budget, when set, reserves each model request and each step's tool
	// calls on the budgets the header lists (budget.go, docs/protocol.md
	// §5.5), so a session that draws on a budget spends nothing without a
	// reservation; unset, or with no budgets in the header, nothing is
	// reserved.
	Budget Budgeter
	// Continuable is true for a continuable child: at its budget's cap its
	// turn pauses on a budget request (with Requests) instead of ending
	// (budgetpause.go).
	Continuable bool
}

// ErrLeaseLost is the cause given to a turn's context when its host lost the
// session's lease: the agent stops at once and appends nothing (docs/design.md §7,
// Settlement 3).
var ErrLeaseLost = contract.ErrLeaseLost

var errTurnTimeout = errors.New("turn timeout")

// Agent is one live session. Turns run one at a time; Events may be read
// concurrently.
type Agent struct {
	cfg    Config
	limits Limits
	log    *slog.Logger

	mu     sync.Mutex
	events []protocol.SessionEvent
	// index is what the runtime reads from events, each decoded once
	// (Index): the conversation, the call ids recorded (kept unique in the
	// session), the inbox cursor.
	index *Index
	turn  int64

	// appendMu serializes appends: the log has one writer, and inbox
	// bookkeeping may append while a turn runs.
	appendMu sync.Mutex
	// settles are the budget settlements in flight (budget.go); a turn
	// waits for them before it returns, unless overlapSettles is set
	// (OverlapSettles): then its host waits for them (WaitSettled).
	settles sync.WaitGroup
	// settling holds, under settlingMu, a channel for each settlement
	// sent, closed when it ends: a model request's reservation waits for
	// them (waitOwnSettles), since the coordinator does not wait for the
	// session's own reservations (budget.go, reserveModel).
	settlingMu     sync.Mutex
	settling       []chan struct{}
	overlapSettles atomic.Bool
	// lastSettles are the settlements of turn-ending steps held for
	// WaitSettled (settleLast); under mu.
	lastSettles []func()
	// prefetched is the first step's reservation taken beside the turn
	// opening (budget.go, prefetch); only the turn's goroutine uses it.
	prefetched chan prefetched

	// retry is the model retry the running turn is paused on (the data of
	// its last model/retry event), nil when none; under mu.
	retry *protocol.ModelRetryData
	// paused is the budget request the running turn is paused on
	// (budgetpause.go), nil when none; under mu.
	paused *protocol.RequestOpenData
}

// New builds an agent over its session's existing events.
func New(cfg Config) (*Agent, error) {
	if cfg.Log == nil || cfg.Model == nil || cfg.Tools == nil {
		return nil, errors.New("agent: Log, Model and Tools are required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	a := &Agent{cfg: cfg, limits: cfg.Limits.withDefaults(), log: cfg.Logger.With("session", cfg.Header.ID)}
	a.events = append([]protocol.SessionEvent(nil), cfg.Events...)
	a.index = NewIndex(true)
	a.index.Add(a.events...)
	a.turn = a.index.LastTurn()
	return a, nil
}

// Header returns the session header.
func (a *Agent) Header() protocol.SessionHeader { return a.cfg.Header }

// Credential returns the agent's credential.
func (a *Agent) Credential() string { return a.cfg.Credential }

// Events returns a copy of the session's events so far.
func (a *Agent) Events() []protocol.SessionEvent {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]protocol.SessionEvent(nil), a.events...)
}

// Delegated reports whether the session's own turns (after any seed) called
// a tool that may start children (Tool.Delegates), so it may have
// descendants to dispose when it ends.
func (a *Agent) Delegated() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	own := a.events
	if seed := a.cfg.Header.SeedLength; seed > 0 && seed <= int64(len(own)) {
		own = own[seed:]
	}
	for _, ev := range own {
		if ev.Type != protocol.EvToolCall {
			continue
		}
		var d protocol.ToolCallData
		if ev.Decode(&d) != nil {
			continue
		}
		if t, ok := a.cfg.Tools.Lookup(d.Name); ok && t.Delegates {
			return true
		}
	}
	return false
}

// CloseOpenTurn returns the events that close a turn the session's log left
// open (a host died mid-turn; sessionlog.CloseOpenTurn), nil when none is:
// read from the agent's Index, so the log is not decoded again.
func (a *Agent) CloseOpenTurn(reason protocol.TurnEndReason, nowMs int64) ([]protocol.SessionEvent, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.index.CloseOpenTurn(reason, nowMs)
}

// EventCount returns how many events the session has.
func (a *Agent) EventCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.events)
}

func (a *Agent) nowMs() int64 { return a.cfg.Now().UnixMilli() }

// RunTurn opens a turn with in and runs it to its end.
func (a *Agent) RunTurn(ctx context.Context, in Input) Outcome {
	if out, ok := a.OpenTurn(ctx, in); !ok {
		return out
	}
	return a.RunSteps(ctx)
}

// OpenTurn appends the turn opening record: turn/start, the inbox claim when
// in came from the inbox, the user message, and in.Extra. ok is false when
// the opening could not be logged (the returned outcome says why).
func (a *Agent) OpenTurn(ctx context.Context, in Input) (Outcome, bool) {
	a.mu.Lock()
	turn := a.turn + 1
	a.mu.Unlock()
	var b eventBuf
	b.add(a, protocol.EvTurnStart, protocol.TurnData{Turn: turn})
	b.evs = append(b.evs, in.Before...)
	if in.InboxSeq > 0 {
		b.add(a, protocol.EvInboxDequeue, protocol.InboxDequeueData{MessageID: in.MessageID, InboxSeq: in.InboxSeq, Turn: turn})
	}
	content := in.Content
	if content == nil {
		content = []protocol.ContentBlock{}
	}
	if a.firstOwnTurn() {
		content = FrameSeeded(content)
	}
	id := in.MessageID
	if id == "" {
		id = fmt.Sprintf("%s-t%d", a.cfg.Header.ID, turn)
	}
	b.add(a, protocol.EvUserMessage, protocol.UserMessageData{ID: id, Turn: turn, Content: content, Source: in.Source})
	b.evs = append(b.evs, in.Extra...)
	if b.err != nil {
		return Outcome{Turn: turn, Reason: errReason(protocol.CodeInternal, b.err.Error()), Err: b.err}, false
	}
	a.prefetch(ctx, content)
	if out, ok := a.append(ctx, turn, b.evs); !ok {
		a.dropPrefetch(ctx)
		return out, false
	}
	a.mu.Lock()
	a.turn = turn
	a.mu.Unlock()
	return Outcome{Turn: turn}, true
}

// SeedFraming is the note added, as a framing block, before the task of a
// seeded (fork) child's first own turn: the inherited turns are its parent's
// context (docs/design.md §6).
const SeedFraming = "The conversation above is context inherited from your parent agent; you are a subagent forked from it. " +
	"Do not continue the parent's work on your own: your task is the following."

// FrameSeeded returns content preceded by the SeedFraming block.
func FrameSeeded(content []protocol.ContentBlock) []protocol.ContentBlock {
	return append([]protocol.ContentBlock{{Type: protocol.BlockText, Text: SeedFraming, Framing: true}}, content...)
}

// firstOwnTurn reports whether the session is seeded and no turn of its own
// has taken input yet: its next turn is its first, whichever path opens it (a
// one-shot start, or a continuable child's first claimed prompt), and gets
// the seed framing.
func (a *Agent) firstOwnTurn() bool {
	seed := a.cfg.Header.SeedLength
	if seed <= 0 {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
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

// RunSteps runs the open turn's steps until the turn ends.
func (a *Agent) RunSteps(ctx context.Context) Outcome {
	a.mu.Lock()
	turn := a.turn
	a.mu.Unlock()
	ctx, cancel := context.WithTimeoutCause(ctx, a.limits.TurnTimeout, errTurnTimeout)
	defer cancel()
	return a.stepsFrom(ctx, turn, 1, nil)
}

// stepsFrom runs turn's steps from step first until the turn ends; ctx
// carries the turn's time limit (and here its budget's deadline). paused,
// when set, is the budget request the turn was paused on before step
// first when its previous host stopped: the turn waits on it first.
func (a *Agent) stepsFrom(ctx context.Context, turn, first int64, paused *protocol.RequestOpenData) Outcome {
	ctx, cancelDeadline := a.withBudgetDeadline(ctx)
	defer cancelDeadline()
	defer a.turnSettled()
	defer a.dropPrefetch(ctx) // a turn that ended before its first request
	if paused != nil {
		if out, done := a.budgetPause(ctx, turn, first, nil, paused, nil); done {
			return out
		}
	}
	for step := first; ; step++ {
		if step > int64(a.limits.StepsPerTurnMax) {
			return a.end(ctx, turn, nil, errReason(protocol.CodeLimitExceeded, fmt.Sprintf("the turn reached its limit of %d steps", a.limits.StepsPerTurnMax)))
		}
		out, done := a.runStep(ctx, turn, step)
		if done {
			return out
		}
	}
}

// runStep runs one model call and its tool calls; done reports the turn ended.
func (a *Agent) runStep(ctx context.Context, turn, step int64) (Outcome, bool) {
	if err := ctx.Err(); err != nil {
		return a.endCancelled(ctx, turn, nil), true
	}
	if out, fenced := a.claimStepItems(ctx, turn); fenced {
		return out, true
	}
	a.mu.Lock()
	history, err := a.index.Messages()
	a.mu.Unlock()
	if err != nil {
		return a.end(ctx, turn, nil, errReason(protocol.CodeInternal, "the session log cannot be replayed: "+err.Error())), true
	}
	req := model.Request{System: a.cfg.System, Messages: history, Tools: a.cfg.Tools.Specs()}
	g, err := a.takeReservation(ctx, &req)
	for err != nil && ctx.Err() == nil && a.pausesAtCap(err) {
		if out, done := a.budgetPause(ctx, turn, step, err, nil, nil); done {
			return out, true
		}
		g, err = a.reserveModel(ctx, &req)
	}
	if err != nil {
		if ctx.Err() != nil {
			return a.endCancelled(ctx, turn, nil), true
		}
		return a.end(ctx, turn, nil, budgetEnd(err)), true
	}
	mc, out, ok := a.callModelRetrying(ctx, turn, step, req)
	used := modelUsed(g, mc.resp.Usage)
	if !ok || mc.err != nil {
		a.settle(ctx, g, used)
	}
	if !ok {
		return out, true
	}
	resp := mc.resp

	var b eventBuf
	b.add(a, protocol.EvStepStart, protocol.StepData{Turn: turn, Step: step, Model: a.cfg.Model.Provider() + "/" + a.cfg.Model.Name()})
	if mc.err != nil {
		return a.endModelFailed(ctx, turn, step, &b, mc), true
	}
	msg := resp.Message
	if msg.Content == nil {
		msg.Content = []protocol.ContentBlock{}
	}
	modelIDs := a.recordCallIDs(&msg)
	b.add(a, protocol.EvAssistantMessage, protocol.AssistantMessageData{
		Turn: turn, Step: step, Message: msg, Usage: resp.Usage, Interrupted: resp.Finish == model.FinishLength,
	})
	if reason, ends := a.answerEnds(resp.Finish, msg); ends {
		a.settleLast(ctx, g, used)
		if g.capped && resp.Finish == model.FinishLength {
			reason = errReason(protocol.CodeBudgetExhausted, fmt.Sprintf("the budget's tokens ran out: the answer was cut at the %d output tokens it had left", req.MaxTokens))
		}
		b.add(a, protocol.EvStepEnd, protocol.StepData{Turn: turn, Step: step})
		return a.end(ctx, turn, &b, reason), true
	}
	a.settle(ctx, g, used)
	for i, c := range msg.ToolCalls {
		d := protocol.ToolCallData{Turn: turn, Step: step, CallID: c.ID, Name: c.Name, Arguments: c.Arguments}
		if modelIDs[i] != c.ID {
			d.ModelCallID = modelIDs[i]
		}
		b.add(a, protocol.EvToolCall, d)
	}
	if b.err != nil {
		return a.end(ctx, turn, nil, errReason(protocol.CodeInternal, b.err.Error())), true
	}
	if out, ok := a.append(ctx, turn, b.evs); !ok {
		return out, true
	}
	return a.runStepTools(ctx, turn, step, msg.ToolCalls)
}

// claimStepItems claims the next-step inbox items (notices, reports) that
// arrived since the last step, so they join this one. It reports true, with
// the outcome, when the log refused the claim: the session was taken over.
// Any other failure leaves the items for the next step.
func (a *Agent) claimStepItems(ctx context.Context, turn int64) (Outcome, bool) {
	if a.cfg.Inbox == nil || (a.cfg.InboxDirty != nil && !a.cfg.InboxDirty()) {
		return Outcome{}, false
	}
	if err := a.claimSteps(ctx, turn); err != nil {
		if errors.Is(err, store.ErrFenced) {
			return Outcome{Turn: turn, Fenced: true}, true
		}
		a.log.Warn("could not claim next-step inbox items; they wait for the next step", "err", err)
	}
	return Outcome{}, false
}

// endModelFailed ends the turn after a model call failed: as endCancelled
// says when ctx was done (keeping the text streamed so far, marked
// interrupted; a turn timeout during a model retry names the last model
// error), error MODEL_ERROR with the model's diagnostic otherwise.
func (a *Agent) endModelFailed(ctx context.Context, turn, step int64, b *eventBuf, mc modelCall) Outcome {
	if ctx.Err() != nil {
		if mc.partial != "" {
			b.add(a, protocol.EvAssistantMessage, protocol.AssistantMessageData{
				Turn: turn, Step: step, Interrupted: true,
				Message: protocol.AssistantMessage{Content: protocol.Text(mc.partial)},
			})
		}
		b.add(a, protocol.EvStepEnd, protocol.StepData{Turn: turn, Step: step})
		return a.endCancelledNote(ctx, turn, b, mc.retriedNote())
	}
	b.add(a, protocol.EvStepEnd, protocol.StepData{Turn: turn, Step: step})
	diag := mc.err.Error()
	var me *model.Error
	if errors.As(mc.err, &me) {
		diag = me.Diagnostic
	}
	return a.end(ctx, turn, b, errReason(protocol.CodeModelError, diag))
}

// answerEnds reports whether a model answer ends the turn, and how: cut at
// the token limit (max-tokens), refused (blocked), without tool calls
// (completed), or with more tool calls than a step may run (error).
func (a *Agent) answerEnds(finish model.Finish, msg protocol.AssistantMessage) (protocol.TurnEndReason, bool) {
	switch {
	case finish == model.FinishLength:
		return protocol.TurnEndReason{Kind: protocol.TurnMaxTokens}, true
	case finish == model.FinishRefusal:
		return protocol.TurnEndReason{Kind: protocol.TurnBlocked}, true
	case len(msg.ToolCalls) == 0:
		return protocol.TurnEndReason{Kind: protocol.TurnCompleted}, true
	case len(msg.ToolCalls) > a.limits.ToolCallsPerStepMax:
		return errReason(protocol.CodeLimitExceeded, fmt.Sprintf("the model asked for %d tool calls in one step; the limit is %d", len(msg.ToolCalls), a.limits.ToolCallsPerStepMax)), true
	}
	return protocol.TurnEndReason{}, false
}

// runStepTools runs a step's logged tool calls and logs their results and
// the step's end; the turn ends when ctx was cancelled (aborted) or a tool
// concluded it (completed), and goes on to its next step otherwise.
func (a *Agent) runStepTools(ctx context.Context, turn, step int64, calls []protocol.ToolCall) (Outcome, bool) {
	tg, out, done := a.reserveToolsPausing(ctx, turn, step, calls, nil)
	if done {
		return out, true
	}
	results := a.runTools(ctx, turn, step, calls)
	a.settle(ctx, tg, protocol.BudgetSpend{ToolCalls: int64(len(calls))})
	return a.logStepResults(ctx, turn, step, calls, results)
}

// logStepResults logs the results of a step's calls and the step's end
// (runStepTools); the turn ends when ctx was cancelled (aborted) or a tool
// concluded it (completed), and goes on to its next step otherwise.
func (a *Agent) logStepResults(ctx context.Context, turn, step int64, calls []protocol.ToolCall, results []ToolResult) (Outcome, bool) {
	var rb eventBuf
	conclude := false
	for i, c := range calls {
		r := results[i]
		rb.add(a, protocol.EvToolResult, protocol.ToolResultData{
			Turn: turn, Step: step, CallID: c.ID, Name: c.Name, Content: r.Content, IsError: r.IsError, Meta: r.Meta, ChildUsage: r.ChildUsage,
		})
		if r.Conclude && !r.IsError {
			conclude = true
		}
	}
	rb.add(a, protocol.EvStepEnd, protocol.StepData{Turn: turn, Step: step})
	switch {
	case ctx.Err() != nil:
		return a.endCancelled(ctx, turn, &rb), true
	case conclude:
		return a.end(ctx, turn, &rb, protocol.TurnEndReason{Kind: protocol.TurnCompleted}), true
	}
	if rb.err != nil {
		return a.end(ctx, turn, nil, errReason(protocol.CodeInternal, rb.err.Error())), true
	}
	if out, ok := a.append(ctx, turn, rb.evs); !ok {
		return out, true
	}
	return Outcome{}, false
}

// recordCallIDs gives msg's tool calls session-unique ids (see CallIDs) and
// returns the ids the model gave, in order.
func (a *Agent) recordCallIDs(msg *protocol.AssistantMessage) []string {
	if len(msg.ToolCalls) == 0 {
		return nil
	}
	calls := append([]protocol.ToolCall(nil), msg.ToolCalls...)
	orig := make([]string, len(calls))
	a.mu.Lock()
	for i := range calls {
		orig[i] = calls[i].ID
		calls[i].ID = a.index.CallIDs().Unique(calls[i].ID)
	}
	a.mu.Unlock()
	msg.ToolCalls = calls
	return orig
}

// runTools runs a step's tool calls: in parallel, except that a message
// calling structured_output runs in order and every call after a successful
// capture is denied (docs/upstream-behaviour.md §1.6).
func (a *Agent) runTools(ctx context.Context, turn, step int64, calls []protocol.ToolCall) []ToolResult {
	results := make([]ToolResult, len(calls))
	sequential := false
	for _, c := range calls {
		if c.Name == model.StructuredOutputTool {
			sequential = true
		}
	}
	if sequential {
		captured := false
		for i, c := range calls {
			if captured {
				results[i] = ErrorResult("denied: structured output was already captured in this step; the turn ends now")
				continue
			}
			results[i] = a.runTool(ctx, turn, step, c, nil)
			captured = results[i].Conclude && !results[i].IsError
		}
		return results
	}
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = a.runTool(ctx, turn, step, c, nil)
		}()
	}
	wg.Wait()
	return results
}

// callModel makes one model call and counts it (brood_model_*).
func (a *Agent) callModel(ctx context.Context, req model.Request, onText func(string)) (model.Response, error) {
	m := a.cfg.Model
	start := time.Now()
	sctx, span := telemetry.StartModel(ctx, m.Provider(), m.Name())
	resp, err := m.Stream(sctx, req, onText)
	outcome := telemetry.OutcomeOK
	switch {
	case err != nil && ctx.Err() != nil:
		outcome = telemetry.OutcomeCancelled
	case err != nil:
		outcome = telemetry.OutcomeError
	}
	a.cfg.Metrics.ModelCall(m.Provider(), m.Name(), outcome, time.Since(start), resp.Usage)
	telemetry.EndModel(span, string(resp.Finish), resp.Usage, err)
	return resp, err
}

// runTool runs call c of turn's step. parked, when set, is the request/open
// the call was parked on before its host died (ContinueParked): the call
// waits for that request's answer instead of opening one.
func (a *Agent) runTool(ctx context.Context, turn, step int64, c protocol.ToolCall, parked *protocol.RequestOpenData) (res ToolResult) {
	t, ok := a.cfg.Tools.Lookup(c.Name)
	if !ok {
		_, span := telemetry.StartTool(ctx, telemetry.ToolUnknown, c.ID)
		res = ErrorResult("unknown tool %q: it is not available to this agent", c.Name)
		telemetry.EndTool(span, true, "unknown tool")
		a.cfg.Metrics.ToolCall(telemetry.ToolUnknown, true, 0)
		return res
	}
	start := time.Now()
	ctx, span := telemetry.StartTool(ctx, c.Name, c.ID)
	defer func() {
		a.cfg.Metrics.ToolCall(c.Name, res.IsError, time.Since(start))
		telemetry.EndTool(span, res.IsError, headline(res))
	}()
	// Arguments that are not a JSON object never reach a tool (empty ones
	// mean {}); the raw text stays in the log and is quoted back.
	if strings.TrimSpace(c.Arguments) != "" && !argsObject(c.Arguments) {
		return argsError(c)
	}
	if t.Asks {
		return a.ask(ctx, turn, step, c, parked)
	}
	if a.cfg.Header.Asks(c.Name, t.NeedsApproval) {
		if a.cfg.Requests == nil {
			return approvalRequired(a.cfg.Header, c.Name)
		}
		if denied, ok := a.awaitApproval(ctx, turn, step, c, parked); !ok {
			return denied
		}
	}
	defer func() {
		if p := recover(); p != nil {
			a.log.Error("tool panicked", "tool", c.Name, "panic", p)
			res = ErrorResult("%s failed: internal error", c.Name)
		}
	}()
	res = t.Run(ctx, ToolContext{Header: a.cfg.Header, Credential: a.cfg.Credential, Turn: turn, Step: step, CallID: c.ID}, c.Arguments)
	if res.Content == nil {
		res.Content = []protocol.ContentBlock{}
	}
	size := 0
	for _, b := range res.Content {
		size += len(b.Text)
	}
	if size > a.limits.ToolOutputBytesMax {
		over := ErrorResult("LIMIT_EXCEEDED: %s produced %d bytes of output, over the limit of %d bytes; none of it is shown, nothing was truncated — ask for less (a narrower path or range)",
			c.Name, size, a.limits.ToolOutputBytesMax)
		over.ChildUsage = res.ChildUsage // a child that answered too much still spent
		return over
	}
	return res
}

// headline is the first line of a tool result's text (a span status).
func headline(r ToolResult) string {
	text := protocol.PlainText(r.Content)
	if i := strings.IndexByte(text, '\n'); i >= 0 {
		text = text[:i]
	}
	return protocol.TruncateDiagnostic(text)
}

// endCancelled ends the turn after ctx was done: aborted with the owner's
// cause, error on the turn timeout, or nothing at all when the lease was lost.
func (a *Agent) endCancelled(ctx context.Context, turn int64, b *eventBuf) Outcome {
	return a.endCancelledNote(ctx, turn, b, "")
}

// endCancelledNote is endCancelled with a note appended to the diagnostic
// of a deadline's error end ("" for none): what the turn was doing when
// its time ran out.
func (a *Agent) endCancelledNote(ctx context.Context, turn int64, b *eventBuf, note string) Outcome {
	cause := context.Cause(ctx)
	if errors.Is(cause, ErrLeaseLost) {
		return Outcome{Turn: turn, Fenced: true, Reason: protocol.TurnEndReason{Kind: protocol.TurnInterrupted}}
	}
	if errors.Is(cause, errTurnTimeout) {
		return a.end(ctx, turn, b, errReason(protocol.CodeLimitExceeded, fmt.Sprintf("the turn exceeded its %s limit", a.limits.TurnTimeout)+note))
	}
	if errors.Is(cause, errBudgetDeadline) {
		return a.end(ctx, turn, b, a.deadlineEnd())
	}
	reason := protocol.TurnEndReason{Kind: protocol.TurnAborted, Cause: protocol.CauseDisposed}
	var c *Cancel
	if errors.As(cause, &c) {
		if c.Cause == protocol.CauseDeadline {
			// A coordinator ends the subtree of a budget whose deadline
			// passed (docs/protocol.md §5.5): the turn ends as one cut by
			// its own deadline, whichever came first.
			return a.end(ctx, turn, b, a.deadlineEnd())
		}
		reason.Cause = c.Cause
		if c.KeepParked && a.ParkedTurn() {
			// A host's drain: the turn stays parked, nothing more is
			// logged, and the session's next activation continues it
			// (parked.go). The reason is not logged: it is the span's.
			a.log.Info("the host stops; the turn stays parked on its request for the next activation", "turn", turn)
			return Outcome{Turn: turn, Reason: reason}
		}
	}
	return a.end(ctx, turn, b, reason)
}

// end appends b's events plus turn/end{reason} as the turn's last record.
func (a *Agent) end(ctx context.Context, turn int64, b *eventBuf, reason protocol.TurnEndReason) Outcome {
	if b == nil {
		b = &eventBuf{}
	}
	b.add(a, protocol.EvTurnEnd, protocol.TurnEndData{Turn: turn, Reason: reason})
	if b.err != nil {
		return Outcome{Turn: turn, Reason: reason, Err: b.err}
	}
	if out, ok := a.append(ctx, turn, b.evs); !ok {
		return out
	}
	return Outcome{Turn: turn, Reason: reason}
}

// append writes evs as one record (split in halves when too large), with its
// own deadline so a turn that was cancelled can still record how it ended.
func (a *Agent) append(ctx context.Context, turn int64, evs []protocol.SessionEvent) (Outcome, bool) {
	if errors.Is(context.Cause(ctx), ErrLeaseLost) {
		return Outcome{Turn: turn, Fenced: true}, false
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.limits.AppendTimeout)
	defer cancel()
	if err := a.appendSplit(actx, evs); err != nil {
		if errors.Is(err, store.ErrFenced) {
			a.log.Warn("session log fenced by another writer; stopping this agent", "turn", turn)
			return Outcome{Turn: turn, Fenced: true}, false
		}
		a.log.Error("session log append failed", "turn", turn, "err", err)
		return Outcome{Turn: turn, Reason: errReason(protocol.CodeDurabilityFailed, "the session log did not accept an append: "+err.Error()), Err: err}, false
	}
	return Outcome{}, true
}

func (a *Agent) appendSplit(ctx context.Context, evs []protocol.SessionEvent) error {
	a.appendMu.Lock()
	written, err := a.cfg.Log.Append(ctx, evs...)
	if err == nil {
		a.mu.Lock()
		a.events = append(a.events, written...)
		a.index.Add(written...)
		a.mu.Unlock()
	}
	a.appendMu.Unlock()
	if err != nil {
		if protocol.CodeOf(err) == protocol.CodeLimitExceeded && len(evs) > 1 {
			half := len(evs) / 2
			if err := a.appendSplit(ctx, evs[:half]); err != nil {
				return err
			}
			return a.appendSplit(ctx, evs[half:])
		}
		return err
	}
	return nil
}

// errReason is an error turn end with the catalogue code that tells its
// class (MODEL_ERROR, LIMIT_EXCEEDED, DURABILITY_FAILED, INTERNAL:
// docs/protocol.md §8.4) and its diagnostic.
func errReason(code protocol.Code, diag string) protocol.TurnEndReason {
	return protocol.TurnEndReason{Kind: protocol.TurnError, Code: code, Error: protocol.TruncateDiagnostic(diag)}
}

// eventBuf collects a record's events, keeping the first encoding error.
type eventBuf struct {
	evs []protocol.SessionEvent
	err error
}

func (b *eventBuf) add(a *Agent, typ string, data any) {
	if b.err != nil {
		return
	}
	ev, err := protocol.NewEvent(typ, a.nowMs(), data)
	if err != nil {
		b.err = err
		return
	}
	b.evs = append(b.evs, ev)
}

// Append logs events between turns (a continuable child's descriptor, the
// closing of a turn a dead host left open) as one record.
func (a *Agent) Append(ctx context.Context, evs ...protocol.SessionEvent) error {
	if out, ok := a.append(ctx, 0, evs); !ok {
		return outcomeErr(out)
	}
	return nil
}
