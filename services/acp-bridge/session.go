package acpbridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/brood-dev/brood/internal/acpio"
	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/provider"
	"github.com/brood-dev/brood/pkg/provider/contract"
	"github.com/brood-dev/brood/pkg/tracecontext"
)

// CauseAgent is the aborted cause recorded when the ACP agent itself ended a
// turn `cancelled` (Brood did not ask it to).
const CauseAgent = "agent"

// PreviousPromptWaitMax bounds how long a new turn waits for the agent to
// answer the previous, cancelled prompt before it prompts again, so a late
// cancellation never reaches the next turn (docs/design.md §12).
const PreviousPromptWaitMax = 10 * time.Second

var errTurnTimeout = errors.New("acp: turn timeout")

// Session is one ACP child as the worker host drives it (provider.Session and
// provider.Closer). It logs the same way an in-process agent does, one record
// per logical step, through the single fenced writer it was given.
//
// It is built for several turns: the first turn starts the agent process and
// opens the ACP session (session/new, or session/load when the log already
// names one: a cold resume); every later turn on the same Session prompts the
// same ACP session again (a followup to a resident child). One-shot runs use
// one turn; the host then calls Close, which tears the process tree down.
//
// Concurrency: turns run one at a time (OpenTurn, then RunSteps). The ACP SDK
// delivers session/update notifications on its own goroutine; they only
// touch the current turn's state under mu. logMu is held across building and
// appending a record, so records never interleave and the turn's last record
// is always last; lock order logMu → mu.
type Session struct {
	p      *Provider
	o      Options
	header protocol.SessionHeader
	log    provider.Appender
	cwd    string
	logger *slog.Logger
	// resume is the ACP session to load instead of creating one (cold resume).
	resume *protocol.ACPSessionData

	// lifetime bounds every SDK call; Close cancels it (the hard stop).
	lifetime context.Context
	stop     context.CancelFunc
	// cred is the child's credential (provider.SessionSpec.Credential): a
	// permission request under PolicyAsk opens and reads its request for
	// approval as the child itself. Never logged.
	cred string
	// asking counts the permission requests waiting for an answer
	// (PolicyAsk): the agent waits on the bridge then, so its silence is
	// not held against it.
	asking atomic.Int64

	logMu sync.Mutex

	mu     sync.Mutex
	events []protocol.SessionEvent
	turn   int64
	prompt []acp.ContentBlock
	source protocol.MessageSource // the open turn's message provenance
	fenced bool
	cur    *turnState
	grant  turnGrant // the open turn's budget reservation (budget.go)
	// startGrantUsed: the reservation taken at admission was this
	// session's first turn's (budget.go).
	startGrantUsed bool
	// continuable: the session is a continuable child's
	// (provider.SessionSpec.Continuable): at its budget's cap its turn
	// pauses rather than ends (budget.go).
	continuable bool
	// paused is the budget request the open turn waits on (BudgetPause),
	// nil when it is not paused.
	paused *protocol.RequestOpenData
	proc   *acpio.Process
	conn   *acp.ClientSideConnection
	// redact hides the bridge's secrets in what the agent writes (its
	// stderr, its error messages) before a diagnostic carries it.
	redact    *acpio.Redactor
	acpID     acp.SessionId
	prompting chan struct{} // closed when the last session/prompt call returned

	// index is what the bridge reads from events, each decoded once
	// (agent.Index): the call ids logged, kept unique in the session (agents
	// may reuse ids across turns), the inbox cursor, the open turn; guarded
	// by mu.
	index *agent.Index
	// sealed is the last turn whose record is closed; what the agent sends
	// while no turn is current is logged as late output of that turn.
	sealed    int64
	late      []lateItem // guarded by mu; written by lateWriter
	lateBytes int64      // text of late chunks kept for the sealed turn
	lateCount int        // late events queued for the sealed turn
	lateKick  chan struct{}
	lateStop  chan struct{}
	lateDone  chan struct{}

	lastRecv      atomic.Int64 // unix nanos of the agent's last JSON message
	dropped       atomic.Int64 // stdout lines that were not JSON objects
	violation     chan struct{}
	violationMsg  string
	violationOnce sync.Once
	closeOnce     sync.Once
}

func newSession(p *Provider, spec provider.SessionSpec, cwd string) *Session {
	lifetime, stop := context.WithCancel(context.Background())
	s := &Session{
		p: p, o: p.opts, header: spec.Header, log: spec.Log, cwd: cwd, cred: spec.Credential, continuable: spec.Continuable,
		logger:   p.opts.Logger.With("provider", p.agent.Name, "session", spec.Header.ID),
		lifetime: lifetime, stop: stop,
		events:    append([]protocol.SessionEvent(nil), spec.Events...),
		index:     agent.NewIndex(false),
		violation: make(chan struct{}),
		lateKick:  make(chan struct{}, 1), lateStop: make(chan struct{}), lateDone: make(chan struct{}),
	}
	s.index.Add(s.events...)
	s.turn = s.index.LastTurn()
	return s
}

// Events returns a copy of the session's events so far.
func (s *Session) Events() []protocol.SessionEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]protocol.SessionEvent(nil), s.events...)
}

// ACPSessionID returns the agent's ACP session id once it is known.
func (s *Session) ACPSessionID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.acpID)
}

// OpenTurn appends the turn's opening record: turn/start, the inbox claim
// when the input came from the inbox, the user message and in.Extra (the
// one-shot descriptor).
func (s *Session) OpenTurn(ctx context.Context, in provider.Input) (provider.Outcome, bool) {
	if errors.Is(context.Cause(ctx), provider.ErrLeaseLost) {
		return provider.Outcome{Fenced: true}, false
	}
	s.mu.Lock()
	turn := s.turn + 1
	s.mu.Unlock()
	var b evBuf
	b.add(protocol.EvTurnStart, protocol.TurnData{Turn: turn})
	if in.InboxSeq > 0 {
		b.add(protocol.EvInboxDequeue, protocol.InboxDequeueData{MessageID: in.MessageID, InboxSeq: in.InboxSeq, Turn: turn})
	}
	content := in.Content
	if content == nil {
		content = []protocol.ContentBlock{}
	}
	id := in.MessageID
	if id == "" {
		id = fmt.Sprintf("%s-t%d", s.header.ID, turn)
	}
	b.add(protocol.EvUserMessage, protocol.UserMessageData{ID: id, Turn: turn, Content: content, Source: in.Source})
	b.evs = append(b.evs, in.Extra...)
	if b.err != nil {
		return provider.Outcome{Turn: turn, Reason: errReason(protocol.CodeInternal, b.err.Error()), Err: b.err}, false
	}
	s.logMu.Lock()
	out, ok := s.append(ctx, turn, b.evs)
	s.logMu.Unlock()
	if !ok {
		return out, false
	}
	s.mu.Lock()
	s.turn, s.prompt, s.source = turn, acpPrompt(content), in.Source
	s.mu.Unlock()
	return provider.Outcome{Turn: turn}, true
}

// acpPrompt is the ACP prompt of a user message's content: its text
// blocks.
func acpPrompt(content []protocol.ContentBlock) []acp.ContentBlock {
	var prompt []acp.ContentBlock
	for _, c := range content {
		if c.Type == protocol.BlockText && c.Text != "" {
			prompt = append(prompt, acp.TextBlock(c.Text))
		}
	}
	return prompt
}

// RunSteps runs the open turn: it starts the agent and its ACP session when
// this is the session's first turn, prompts, records what the agent reports,
// and ends the turn. It returns promptly when ctx is cancelled: with an
// *provider.Cancel cause the turn ends aborted with the text so far (the agent gets
// session/cancel and is torn down by Close), with provider.ErrLeaseLost nothing
// more is appended.
func (s *Session) RunSteps(ctx context.Context) provider.Outcome {
	return s.runTurn(ctx, nil)
}

// runTurn runs the open turn (RunSteps); parked, when set, is the budget
// request the turn was paused on when its previous host stopped
// (ContinueParked): the turn waits on it before it reserves.
func (s *Session) runTurn(ctx context.Context, parked *protocol.RequestOpenData) provider.Outcome {
	s.mu.Lock()
	turn, prompt, source := s.turn, s.prompt, s.source
	s.mu.Unlock()
	ctx, cancel := context.WithTimeoutCause(ctx, s.o.TurnTimeout, errTurnTimeout)
	defer cancel()
	if e := s.ctxEnding(ctx); e != nil {
		return s.endTurn(ctx, nil, turn, *e)
	}
	if e := s.reservePausing(ctx, turn, promptText(prompt), parked); e != nil {
		return s.endTurn(ctx, nil, turn, *e)
	}
	s.mu.Lock()
	attached := s.conn != nil
	s.mu.Unlock()
	var b evBuf
	if !attached {
		data, e := s.attach(ctx)
		if e != nil {
			return s.endTurn(ctx, nil, turn, *e)
		}
		b.add(protocol.EvACPSession, data)
	} else if e := s.awaitPreviousPrompt(ctx); e != nil {
		return s.endTurn(ctx, nil, turn, *e)
	}
	t := newTurnState(turn, 1)
	t.askCtx, t.askCancel = context.WithCancel(ctx)
	defer t.askCancel()
	b.add(protocol.EvStepStart, protocol.StepData{Turn: turn, Step: t.step})
	if b.err != nil {
		return provider.Outcome{Turn: turn, Reason: errReason(protocol.CodeInternal, b.err.Error()), Err: b.err}
	}
	s.logMu.Lock()
	out, ok := s.append(ctx, turn, b.evs)
	if ok {
		s.mu.Lock()
		s.cur = t
		s.mu.Unlock()
	}
	s.logMu.Unlock()
	if !ok {
		return out
	}
	go s.writer(ctx, t)
	// The agent's silence counts from the prompt: the session may have
	// been idle, or paused at its budget's cap, for longer than the bound.
	s.touch()
	done, res := s.startPrompt(ctx, prompt, source)
	e := s.await(ctx, t, done, "the turn")
	if e == nil {
		e = s.promptEnding(res)
		if res.err == nil {
			// Updates may trail the answer (issue 14): they still count
			// for this turn until the agent was quiet for a moment.
			if f := s.awaitQuiet(ctx, t); f != nil {
				e = f
			}
		}
	}
	return s.endTurn(ctx, t, turn, *e)
}

// awaitQuiet waits, after the agent answered the turn's prompt, until it sent
// nothing for SealQuiet, at most SealWaitMax in all: session/update messages
// that arrive in that time still belong to the turn. It returns the failure
// of the turn when something broke it meanwhile (a violation, a failed
// append, an answer over its limit), else nil; a done ctx ends the wait
// early with the answer as it was.
func (s *Session) awaitQuiet(ctx context.Context, t *turnState) *ending {
	deadline := time.Now().Add(s.o.SealWaitMax)
	for {
		s.mu.Lock()
		last := t.lastUpdate
		s.mu.Unlock()
		wait := min(time.Until(last.Add(s.o.SealQuiet)), time.Until(deadline))
		if wait <= 0 {
			return nil
		}
		tm := time.NewTimer(wait)
		select {
		case <-t.failed:
			tm.Stop()
			return t.failure
		case <-s.violation:
			tm.Stop()
			return errEnding("%s", s.violationMsg)
		case <-ctx.Done():
			tm.Stop()
			return nil
		case <-tm.C:
		}
	}
}

// ending is how a turn ends: the turn/end reason, or fenced (append
// nothing), or a log append that failed (err); cancelRemote sends
// session/cancel; cut marks the answer so far as interrupted.
type ending struct {
	reason       protocol.TurnEndReason
	fenced       bool
	err          error
	cancelRemote bool
	cut          bool
	// usage is the turn's token usage as the agent's answer to
	// session/prompt reported it (ACP's PromptResponse.usage); nil: the
	// agent sent none, and the turn's usage is logged unknown.
	usage *protocol.Usage
}

func errEnding(format string, args ...any) *ending {
	return &ending{reason: errReason(protocol.CodeModelError, fmt.Sprintf(format, args...)), cancelRemote: true, cut: true}
}

// errReason is an error turn end with its class's code (docs/protocol.md
// §8.4): the ACP agent plays the model's part, so its own failures are
// MODEL_ERROR.
func errReason(code protocol.Code, diag string) protocol.TurnEndReason {
	return protocol.TurnEndReason{Kind: protocol.TurnError, Code: code, Error: protocol.TruncateDiagnostic(diag)}
}

// ctxEnding maps a done turn context to its ending (nil while it runs).
func (s *Session) ctxEnding(ctx context.Context) *ending {
	if ctx.Err() == nil {
		return nil
	}
	cause := context.Cause(ctx)
	var c *provider.Cancel
	switch {
	case errors.Is(cause, provider.ErrLeaseLost):
		return &ending{fenced: true, cancelRemote: true}
	case errors.Is(cause, errTurnTimeout):
		return errEnding("the ACP turn exceeded its %s limit", s.o.TurnTimeout)
	case errors.As(cause, &c) && c.Cause == protocol.CauseDeadline:
		// A coordinator ends the subtree of a budget whose deadline passed
		// (docs/protocol.md §5.5): the turn ends as the agent runtime's
		// does at its deadline.
		r := errReason(protocol.CodeBudgetExhausted, "the budget's deadline passed; the turn was cut there")
		return &ending{reason: r, cancelRemote: true, cut: true}
	case errors.As(cause, &c):
		return &ending{reason: protocol.TurnEndReason{Kind: protocol.TurnAborted, Cause: c.Cause}, cancelRemote: true, cut: true}
	default:
		return &ending{reason: protocol.TurnEndReason{Kind: protocol.TurnAborted, Cause: protocol.CauseDisposed}, cancelRemote: true, cut: true}
	}
}

// attach starts the agent process and opens (or loads) its ACP session:
// initialize with every client capability false, then session/new with the
// workspace and the child's lineage in _meta, or session/load for a resume.
func (s *Session) attach(ctx context.Context) (protocol.ACPSessionData, *ending) {
	var data protocol.ACPSessionData
	a := s.p.agent
	environ := s.o.Environ()
	redact := acpio.NewRedactor(environ, a.Env)
	proc, err := acpio.Start(acpio.Command{
		Path: a.Command, Args: a.Args, Env: acpio.AgentEnv(environ, a.PassEnv, a.Env), Dir: s.cwd,
		Redact: redact,
		OnStderrLine: func(line string) {
			s.logger.Debug("ACP agent stderr", "line", redact.Redact(line))
		},
	})
	if err != nil {
		s.o.Metrics.ACPStartFailed(a.Name)
		return data, &ending{reason: errReason(protocol.CodeModelError, fmt.Sprintf("could not start the ACP agent %q: %v", a.Command, err))}
	}
	exited := s.o.Metrics.ACPStarted(a.Name)
	go func() { <-proc.Exited(); exited() }()
	s.touch()
	filter := acpio.NewLineFilter(proc.Stdout, s.o.LineBytesMax, s.touch, s.onDrop)
	conn := acp.NewClientSideConnection(client{s}, proc.Stdin, filter)
	conn.SetLogger(s.logger.With("component", "acp-sdk"))
	s.mu.Lock()
	s.proc, s.conn, s.redact = proc, conn, redact
	s.mu.Unlock()
	go s.lateWriter()
	s.logger.Debug("ACP agent started", "pid", proc.Pid(), "command", a.Command, "cwd", s.cwd)

	var init acp.InitializeResponse
	if e := s.call(ctx, "initialize", func(cctx context.Context) (err error) {
		init, err = conn.Initialize(cctx, acp.InitializeRequest{
			ProtocolVersion:    acp.ProtocolVersionNumber,
			ClientCapabilities: acp.ClientCapabilities{},
			ClientInfo:         &acp.Implementation{Name: "brood", Version: s.o.Version},
		})
		return err
	}); e != nil {
		return data, e
	}
	data.ProtocolVersion = int64(init.ProtocolVersion)
	data.LoadSession = init.AgentCapabilities.LoadSession
	if info := init.AgentInfo; info != nil {
		data.Agent = strings.TrimSpace(info.Name + " " + info.Version)
	}
	// The child's turn's trace context goes with the lineage (root keys of
	// `_meta`, where ACP reserves them): a Brood agent behind the hop
	// continues the delegation tree's trace (brood acp-agent).
	meta := tracecontext.InjectMeta(ctx, protocol.LineageOfHeader(s.header).Meta())
	if s.resume != nil {
		if !data.LoadSession {
			return data, &ending{reason: errReason(protocol.CodeModelError, fmt.Sprintf("%s: the ACP agent no longer advertises session/load, so ACP session %s cannot be restored",
				protocol.CodeNotResumable, s.resume.SessionID))}
		}
		data.SessionID, data.Loaded = s.resume.SessionID, true
		// The agent replays the session's history as session/update
		// notifications before it answers; no turn is current, so they are
		// not recorded again.
		if e := s.call(ctx, "session/load", func(cctx context.Context) error {
			_, err := conn.LoadSession(cctx, acp.LoadSessionRequest{
				SessionId: acp.SessionId(data.SessionID), Cwd: s.cwd, McpServers: []acp.McpServer{}, Meta: meta,
			})
			return err
		}); e != nil {
			return data, e
		}
	} else {
		var resp acp.NewSessionResponse
		if e := s.call(ctx, "session/new", func(cctx context.Context) (err error) {
			resp, err = conn.NewSession(cctx, acp.NewSessionRequest{Cwd: s.cwd, McpServers: []acp.McpServer{}, Meta: meta})
			return err
		}); e != nil {
			return data, e
		}
		if resp.SessionId == "" {
			return data, errEnding("the ACP agent answered session/new without a sessionId")
		}
		data.SessionID = string(resp.SessionId)
	}
	s.mu.Lock()
	s.acpID = acp.SessionId(data.SessionID)
	s.mu.Unlock()
	return data, nil
}

// call runs one startup request under the turn's bounds. The request's own
// context is cancelled when the wait ends early (nothing to cancel
// gracefully before a session exists).
func (s *Session) call(ctx context.Context, what string, fn func(context.Context) error) *ending {
	cctx, cancel := context.WithCancel(s.lifetime)
	defer cancel()
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		err = fn(cctx)
	}()
	if e := s.await(ctx, nil, done, what); e != nil {
		e.cancelRemote = false
		return e
	}
	if err != nil {
		e := s.rpcEnding(what, err)
		e.cancelRemote = false
		return e
	}
	return nil
}

type promptResult struct {
	resp acp.PromptResponse
	err  error
}

// startPrompt sends session/prompt. Its context is the session's lifetime:
// a turn that ends early asks the agent to stop with session/cancel rather
// than abandoning the request (an abandoned request is a JSON-RPC error, not
// a stop reason, docs/design.md §12); Close is the hard stop.
//
// The prompt's provenance travels in `_meta.brood.source` (ACPPromptMeta), so
// a Brood ACP agent logs a message relayed from a parent agent as such, not
// as the user's; other agents ignore `_meta`. The W3C trace context of ctx
// (the turn's) travels in `_meta` too (`traceparent`, tracecontext.InjectMeta),
// so the agent's work joins the delegation tree's trace; ctx is not the
// request's context.
func (s *Session) startPrompt(ctx context.Context, prompt []acp.ContentBlock, source protocol.MessageSource) (<-chan struct{}, *promptResult) {
	res := &promptResult{}
	done := make(chan struct{})
	s.mu.Lock()
	s.prompting = done
	conn, id := s.conn, s.acpID
	s.mu.Unlock()
	if prompt == nil {
		prompt = []acp.ContentBlock{}
	}
	var meta map[string]any
	if source.Kind != "" {
		meta = map[string]any{protocol.ACPMetaKey: protocol.ACPPromptMeta{Source: &source}}
	}
	meta = tracecontext.InjectMeta(ctx, meta)
	go func() {
		defer close(done)
		res.resp, res.err = conn.Prompt(s.lifetime, acp.PromptRequest{SessionId: id, Prompt: prompt, Meta: meta})
		s.mu.Lock()
		if s.cur != nil {
			s.cur.lastUpdate = time.Now() // the quiet period starts at the answer
		}
		s.mu.Unlock()
	}()
	return done, res
}

// awaitPreviousPrompt waits (bounded) for the agent to answer the previous
// turn's prompt, so its late `cancelled` can never end this turn.
func (s *Session) awaitPreviousPrompt(ctx context.Context) *ending {
	s.mu.Lock()
	prev := s.prompting
	s.mu.Unlock()
	if prev == nil {
		return nil
	}
	select {
	case <-prev:
		return nil
	case <-ctx.Done():
		return s.ctxEnding(ctx)
	case <-time.After(PreviousPromptWaitMax):
		return errEnding("the ACP agent did not finish its previous, cancelled turn within %s", PreviousPromptWaitMax)
	}
}

// await waits for done under every bound of a turn: the turn's context
// (dispose, lease loss, turn timeout), a failure recorded by the turn, a
// stdout protocol violation, the agent's exit, and the silence bound. It
// returns nil when done closed first.
func (s *Session) await(ctx context.Context, t *turnState, done <-chan struct{}, what string) *ending {
	var failed <-chan struct{}
	if t != nil {
		failed = t.failed
	}
	s.mu.Lock()
	exited := s.proc.Exited()
	s.mu.Unlock()
	tick := time.NewTicker(min(max(s.o.SilenceTimeout/10, 10*time.Millisecond), 250*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-done:
			// What broke the turn while the answer arrived still counts.
			select {
			case <-failed:
				return t.failure
			case <-s.violation:
				return errEnding("%s", s.violationMsg)
			default:
				return nil
			}
		case <-ctx.Done():
			return s.ctxEnding(ctx)
		case <-failed:
			return t.failure
		case <-s.violation:
			return errEnding("%s", s.violationMsg)
		case <-exited:
			select {
			case <-done:
				return nil
			case <-time.After(s.o.ExitGrace):
			}
			return s.exitEnding(what)
		case <-tick.C:
			if s.asking.Load() > 0 {
				continue // the agent waits for an answer the bridge owes it
			}
			silent := time.Since(time.Unix(0, s.lastRecv.Load()))
			if silent > s.o.SilenceTimeout {
				return errEnding("the ACP agent sent no message for %s during %s (the silence bound is %s)",
					silent.Round(time.Millisecond), what, s.o.SilenceTimeout)
			}
		}
	}
}

// StderrSettleMax bounds how long a diagnostic waits for the rest of a dead
// agent's stderr.
const StderrSettleMax = 500 * time.Millisecond

// StderrDiagnosticBytesMax bounds the end of an agent's stderr a run's
// diagnostic carries (whole lines where possible), after the values of the
// bridge's environment are redacted (acpio.Redactor; docs/security.md,
// "Secrets stay home").
const StderrDiagnosticBytesMax = 1024

// exitEnding describes an agent that went away during what, with the end of
// its stderr (bounded, the bridge's secrets redacted).
func (s *Session) exitEnding(what string) *ending {
	s.mu.Lock()
	proc := s.proc
	s.mu.Unlock()
	select {
	case <-proc.Exited():
	case <-time.After(s.o.ExitGrace):
	}
	// The stderr copier may still hold the agent's last words.
	proc.WaitStderr(StderrSettleMax)
	msg := fmt.Sprintf("the ACP agent closed its stdout during %s", what)
	if st := proc.ExitStatus(); st != "" {
		msg = fmt.Sprintf("the ACP agent exited (%s) during %s", st, what)
	}
	if tail := proc.StderrTail(StderrDiagnosticBytesMax); tail != "" {
		msg += "; the end of its stderr: " + tail
	}
	return errEnding("%s", msg)
}

// rpcEnding maps a failed request: a transport failure (the agent went
// away) is described as such; a JSON-RPC error keeps its message, with a hint
// when the agent asks for authentication.
func (s *Session) rpcEnding(what string, err error) *ending {
	s.mu.Lock()
	proc, conn, redact := s.proc, s.conn, s.redact
	s.mu.Unlock()
	gone := false
	select {
	case <-conn.Done():
		gone = true
	case <-proc.Exited():
		gone = true
	default:
	}
	if gone {
		return s.exitEnding(what)
	}
	msg := fmt.Sprintf("%s failed: %s", what, redact.Redact(rpcErrorText(err)))
	var re *acp.RequestError
	if errors.As(err, &re) && (re.Code == -32000 || strings.Contains(strings.ToLower(re.Message), "auth")) {
		msg += "; the ACP agent requires authentication: name the credentials it needs in the provider's env " +
			"(env=NAME passes the bridge's own variable; an agent gets nothing of the bridge's environment it does not name) or log the agent in"
	}
	return errEnding("%s", msg)
}

func rpcErrorText(err error) string {
	var re *acp.RequestError
	if !errors.As(err, &re) {
		return err.Error()
	}
	text := fmt.Sprintf("%s (JSON-RPC error %d)", re.Message, re.Code)
	if m, ok := re.Data.(map[string]any); ok {
		for _, k := range []string{"details", "error", "message"} {
			if v, ok := m[k].(string); ok && v != "" && v != re.Message {
				if len(v) > 512 {
					v = v[:512] + "…"
				}
				text += ": " + v
				break
			}
		}
	}
	return text
}

// promptEnding maps the answer to session/prompt (docs/upstream-behaviour.md §4):
// end_turn → completed, max_tokens → max-tokens, refusal → blocked (stop
// reason refusal), cancelled → aborted, anything else → error.
func (s *Session) promptEnding(res *promptResult) *ending {
	if res.err != nil {
		return s.rpcEnding("session/prompt", res.err)
	}
	e := s.answerEnding(res)
	if u := res.resp.Usage; u != nil && u.InputTokens >= 0 && u.OutputTokens >= 0 {
		e.usage = &protocol.Usage{InputTokens: int64(u.InputTokens), OutputTokens: int64(u.OutputTokens)}
	}
	return e
}

// answerEnding maps an answer's stop reason (promptEnding).
func (s *Session) answerEnding(res *promptResult) *ending {
	switch r := res.resp.StopReason; r {
	case acp.StopReasonEndTurn:
		// A Brood ACP agent says end_turn for a failed turn and records
		// the real end in _meta (ACP has no error stop reason).
		var m struct {
			TurnEnd *protocol.ACPTurnEnd `json:"turnEnd"`
		}
		if protocol.ACPMetaOf(res.resp.Meta, &m) && m.TurnEnd != nil && m.TurnEnd.Kind == protocol.TurnError {
			return &ending{reason: errReason(protocol.CodeModelError, "the ACP agent's turn failed: "+m.TurnEnd.Error)}
		}
		return &ending{reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}}
	case acp.StopReasonMaxTokens:
		return &ending{reason: protocol.TurnEndReason{Kind: protocol.TurnMaxTokens}, cut: true}
	case acp.StopReasonRefusal:
		return &ending{reason: protocol.TurnEndReason{Kind: protocol.TurnBlocked}}
	case acp.StopReasonCancelled:
		return &ending{reason: protocol.TurnEndReason{Kind: protocol.TurnAborted, Cause: CauseAgent}, cut: true}
	default:
		return &ending{reason: errReason(protocol.CodeModelError, fmt.Sprintf("the ACP agent ended the turn with stop reason %q", r)), cut: true}
	}
}

// endTurn stops the turn's writer and appends its last record: what the
// writer had not flushed, an error result for every tool call still open,
// the answer, step/end and turn/end.
func (s *Session) endTurn(ctx context.Context, t *turnState, turn int64, e ending) provider.Outcome {
	if t != nil {
		// A permission request still waiting for its answer is answered
		// `cancelled` and logged in this turn's last record.
		s.mu.Lock()
		t.asksClosed = true
		s.mu.Unlock()
		t.askCancel()
		t.asks.Wait()
		close(t.stopWriter)
		<-t.writerDone
	}
	if e.cancelRemote {
		s.cancelRemote()
	}
	// The reservation is settled before the turn's end is logged, so
	// before its run settles (docs/protocol.md §5.5).
	s.settleTurn(ctx, t != nil, e.usage)
	s.logMu.Lock()
	defer s.logMu.Unlock()
	s.mu.Lock()
	if s.cur == t {
		s.cur = nil
	}
	if t != nil {
		s.sealed, s.lateBytes, s.lateCount = turn, 0, 0
	}
	var b evBuf
	if t != nil {
		t.done = true
		b.evs = append(b.evs, t.pending...)
		t.pending = nil
		for _, id := range t.order {
			if ts := t.tools[id]; !ts.resulted {
				b.add(protocol.EvToolResult, protocol.ToolResultData{
					Turn: turn, Step: t.step, CallID: ts.logID, Name: ts.name, IsError: true,
					Content: protocol.Text("the tool call had not finished when the turn ended (" + e.reason.Kind + ")"),
				})
			}
		}
		// The turn is one model request (the agent plays the model): its
		// message carries the usage the agent reported, or says it is
		// unknown, never zero (docs/protocol.md §6.6). With no text, a
		// reported usage still gets an empty message of its own.
		usage := e.usage
		if usage == nil {
			usage = &protocol.Usage{Unknown: true}
		}
		s.o.Metrics.ACPTurnUsage(s.p.agent.Name, usage)
		if text := t.text.String(); text != "" && !t.overflow {
			b.add(protocol.EvAssistantMessage, protocol.AssistantMessageData{
				Turn: turn, Step: t.step, Message: protocol.AssistantMessage{Content: protocol.Text(text)}, Usage: usage, Interrupted: e.cut,
			})
		} else if e.usage != nil {
			b.add(protocol.EvAssistantMessage, protocol.AssistantMessageData{
				Turn: turn, Step: t.step, Message: protocol.AssistantMessage{Content: []protocol.ContentBlock{}}, Usage: usage,
			})
		}
		b.add(protocol.EvStepEnd, protocol.StepData{Turn: turn, Step: t.step})
	}
	s.mu.Unlock()
	if e.fenced {
		return provider.Outcome{Turn: turn, Fenced: true, Reason: protocol.TurnEndReason{Kind: protocol.TurnInterrupted}}
	}
	if e.err != nil {
		return provider.Outcome{Turn: turn, Reason: e.reason, Err: e.err}
	}
	b.add(protocol.EvTurnEnd, protocol.TurnEndData{Turn: turn, Reason: e.reason})
	if b.err != nil {
		return provider.Outcome{Turn: turn, Reason: errReason(protocol.CodeInternal, b.err.Error()), Err: b.err}
	}
	if out, ok := s.append(ctx, turn, b.evs); !ok {
		return out
	}
	return provider.Outcome{Turn: turn, Reason: e.reason}
}

// cancelRemote asks the agent to stop the current prompt. It never blocks
// the turn: an agent that does not read its stdin cannot stall settlement.
func (s *Session) cancelRemote() {
	s.mu.Lock()
	conn, id := s.conn, s.acpID
	s.mu.Unlock()
	if conn == nil || id == "" {
		return
	}
	go func() { _ = conn.Cancel(context.Background(), acp.CancelNotification{SessionId: id}) }()
}

// writer appends the tool events the agent reports while the turn runs,
// coalescing whatever accumulated into one record, so the SDK's
// notification goroutine never waits on JetStream.
func (s *Session) writer(ctx context.Context, t *turnState) {
	defer close(t.writerDone)
	for {
		select {
		case <-t.stopWriter:
			return
		case <-t.kick:
		}
		s.logMu.Lock()
		s.mu.Lock()
		evs := t.pending
		t.pending = nil
		s.mu.Unlock()
		if len(evs) > 0 {
			if out, ok := s.append(ctx, t.turn, evs); !ok {
				t.fail(&ending{fenced: out.Fenced, err: out.Err, reason: out.Reason, cancelRemote: true})
			}
		}
		s.logMu.Unlock()
	}
}

// append writes evs as one record (split when too large), with its own
// deadline so a cancelled turn can still record how it ended. The caller
// holds logMu.
func (s *Session) append(ctx context.Context, turn int64, evs []protocol.SessionEvent) (provider.Outcome, bool) {
	s.mu.Lock()
	fenced := s.fenced
	s.mu.Unlock()
	if fenced || errors.Is(context.Cause(ctx), provider.ErrLeaseLost) {
		return provider.Outcome{Turn: turn, Fenced: true}, false
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.o.AppendTimeout)
	defer cancel()
	if err := s.appendSplit(actx, evs); err != nil {
		if errors.Is(err, provider.ErrFenced) {
			s.mu.Lock()
			s.fenced = true
			s.mu.Unlock()
			s.logger.Warn("session log fenced by another writer; stopping this ACP child", "turn", turn)
			return provider.Outcome{Turn: turn, Fenced: true}, false
		}
		s.logger.Error("session log append failed", "turn", turn, "err", err)
		return provider.Outcome{Turn: turn, Reason: errReason(protocol.CodeDurabilityFailed, "the session log did not accept an append: "+err.Error()), Err: err}, false
	}
	return provider.Outcome{}, true
}

func (s *Session) appendSplit(ctx context.Context, evs []protocol.SessionEvent) error {
	written, err := s.log.Append(ctx, evs...)
	if err != nil {
		if protocol.CodeOf(err) == protocol.CodeLimitExceeded && len(evs) > 1 {
			half := len(evs) / 2
			if err := s.appendSplit(ctx, evs[:half]); err != nil {
				return err
			}
			return s.appendSplit(ctx, evs[half:])
		}
		return err
	}
	s.mu.Lock()
	s.events = append(s.events, written...)
	s.index.Add(written...)
	s.mu.Unlock()
	return nil
}

// Close tears the agent's process tree down (EOF, then SIGTERM, then SIGKILL
// to its group, grandchildren included) and reaps it. The host calls it after
// the run settled, so teardown never delays a result. Idempotent.
func (s *Session) Close() error {
	s.closeOnce.Do(func() {
		s.stop()
		s.mu.Lock()
		proc := s.proc
		s.mu.Unlock()
		if proc == nil {
			return
		}
		rep := proc.Teardown(s.o.EOFGrace, s.o.TermGrace)
		// What the agent sent until it was gone is logged, then the writer ends.
		close(s.lateStop)
		select {
		case <-s.lateDone:
		case <-time.After(s.o.AppendTimeout + time.Second):
			s.logger.Warn("late ACP output was not logged in time")
		}
		s.logger.Debug("ACP agent torn down", "pid", proc.Pid(), "how", rep.String(), "exit", proc.ExitStatus())
		if n := s.dropped.Load(); n > 0 {
			s.logger.Info("lines that were not JSON objects were dropped from the ACP agent's stdout", "lines", n)
		}
	})
	return nil
}

// touch records a message from the agent (the silence bound's clock).
func (s *Session) touch() { s.lastRecv.Store(time.Now().UnixNano()) }

// onDrop handles a stdout line the filter did not forward: stray text is
// logged (the first few) and ignored; an oversize line is a lost message, so
// the turn ends.
func (s *Session) onDrop(d acpio.Drop) {
	if d.Oversize {
		s.violationOnce.Do(func() {
			s.violationMsg = fmt.Sprintf("the ACP agent wrote a line to its stdout over the %d-byte limit (%d bytes had arrived without a newline when it crossed it); the message is lost, so the conversation cannot go on",
				s.o.LineBytesMax, d.Bytes)
			close(s.violation)
		})
		return
	}
	const logged = 5
	if n := s.dropped.Add(1); n <= logged {
		s.logger.Info("dropped a line that is not a JSON object from the ACP agent's stdout", "bytes", d.Bytes, "dropped", n)
	}
}

// onUpdate records one session/update of the current turn: message chunks
// into the answer, tool calls and their completion as log events. Thoughts,
// plans and the rest are consumed and dropped (docs/upstream-behaviour.md §4).
func (s *Session) onUpdate(n acp.SessionNotification) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n.SessionId != s.acpID {
		return
	}
	t := s.cur
	if t == nil || t.done {
		s.onLateUpdate(n.Update)
		return
	}
	t.lastUpdate = time.Now()
	u := n.Update
	switch {
	case u.AgentMessageChunk != nil:
		tb := u.AgentMessageChunk.Content.Text
		if tb == nil || t.overflow || isTurnErrorNotice(u.AgentMessageChunk.Meta) {
			return
		}
		if t.text.Len()+len(tb.Text) > s.o.OutputBytesMax {
			t.overflow = true
			t.fail(errEnding("%s: the ACP agent's answer exceeded %d bytes; nothing of it was kept, nothing was truncated",
				protocol.CodeLimitExceeded, s.o.OutputBytesMax))
			return
		}
		t.text.WriteString(tb.Text)
	case u.ToolCall != nil:
		c := u.ToolCall
		ts := s.toolStart(t, string(c.ToolCallId), c.Title, string(c.Kind), c.RawInput)
		s.toolEnd(t, ts, string(c.ToolCallId), c.Status, c.Content, c.RawOutput)
	case u.ToolCallUpdate != nil:
		c := u.ToolCallUpdate
		var title, kind string
		if c.Title != nil {
			title = *c.Title
		}
		if c.Kind != nil {
			kind = string(*c.Kind)
		}
		ts := s.toolStart(t, string(c.ToolCallId), title, kind, c.RawInput)
		if c.Status != nil {
			s.toolEnd(t, ts, string(c.ToolCallId), *c.Status, c.Content, c.RawOutput)
		}
	}
}

// LateUpdatesMax bounds the acp/late-update and late acp/permission events
// logged for one sealed turn; later ones are dropped with a warning.
const LateUpdatesMax = 256

// lateItem is a late event waiting for lateWriter: an update (message text
// chunks are joined into one) or a permission request.
type lateItem struct {
	upd  *protocol.ACPLateUpdateData
	perm *protocol.ACPPermissionData
}

// onLateUpdate records an update that arrived while no turn was current
// (Session.mu held): after a turn was sealed it belongs to that turn, and is
// logged against it as acp/late-update, never counted for the next turn.
// Message text and tool-call reports are kept; thoughts, plans and the rest
// are dropped as they are during a turn. Before any turn was sealed (the
// history an agent replays during session/load) nothing is recorded.
func (s *Session) onLateUpdate(u acp.SessionUpdate) {
	if s.sealed == 0 {
		return
	}
	d := &protocol.ACPLateUpdateData{Turn: s.sealed}
	switch {
	case u.AgentMessageChunk != nil:
		tb := u.AgentMessageChunk.Content.Text
		if tb == nil || tb.Text == "" || isTurnErrorNotice(u.AgentMessageChunk.Meta) {
			return
		}
		d.Kind = "agent_message_chunk"
		keep := min(int64(len(tb.Text)), max(0, int64(s.o.ToolTextBytesMax)-s.lateBytes))
		s.lateBytes += int64(len(tb.Text))
		if n := len(s.late); n > 0 && s.late[n-1].upd != nil && s.late[n-1].upd.Kind == d.Kind && s.late[n-1].upd.Turn == d.Turn {
			prev := s.late[n-1].upd
			prev.Text += tb.Text[:keep]
			prev.OmittedBytes += int64(len(tb.Text)) - keep
			return
		}
		d.Text, d.OmittedBytes = tb.Text[:keep], int64(len(tb.Text))-keep
	case u.ToolCall != nil:
		d.Kind, d.ToolCallID, d.Title, d.Status = "tool_call", string(u.ToolCall.ToolCallId), u.ToolCall.Title, string(u.ToolCall.Status)
	case u.ToolCallUpdate != nil:
		d.Kind, d.ToolCallID = "tool_call_update", string(u.ToolCallUpdate.ToolCallId)
		if u.ToolCallUpdate.Title != nil {
			d.Title = *u.ToolCallUpdate.Title
		}
		if u.ToolCallUpdate.Status != nil {
			d.Status = string(*u.ToolCallUpdate.Status)
		}
	default:
		return
	}
	s.queueLate(lateItem{upd: d})
}

// queueLate queues a late event for lateWriter (Session.mu held).
func (s *Session) queueLate(it lateItem) {
	if s.lateCount >= LateUpdatesMax {
		if s.lateCount == LateUpdatesMax {
			s.logger.Warn("the ACP agent keeps sending output after its turn ended; no more of it is logged", "turn", s.sealed, "limit", LateUpdatesMax)
		}
		s.lateCount++
		return
	}
	s.lateCount++
	s.late = append(s.late, it)
	select {
	case s.lateKick <- struct{}{}:
	default:
	}
}

// lateWriter appends late events as they come, off the SDK's notification
// goroutine, until Close; then it logs what is left and ends.
func (s *Session) lateWriter() {
	defer close(s.lateDone)
	for {
		select {
		case <-s.lateKick:
			s.flushLate()
		case <-s.lateStop:
			s.flushLate()
			return
		}
	}
}

func (s *Session) flushLate() {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	s.mu.Lock()
	items := s.late
	s.late = nil
	s.mu.Unlock()
	if len(items) == 0 {
		return
	}
	var b evBuf
	var turn int64
	for _, it := range items {
		if it.upd != nil {
			turn = it.upd.Turn
			b.add(protocol.EvACPLateUpdate, *it.upd)
		} else {
			turn = it.perm.Turn
			b.add(protocol.EvACPPermission, *it.perm)
		}
	}
	if b.err != nil {
		s.logger.Warn("late ACP output not logged", "err", b.err)
		return
	}
	if _, ok := s.append(context.Background(), turn, b.evs); !ok {
		s.logger.Warn("late ACP output not logged: the session log refused it", "turn", turn)
	}
}

// isTurnErrorNotice reports a Brood ACP agent's note on why a turn failed
// (ACPNoticeTurnError): for an editor's eyes, not the child's answer.
func isTurnErrorNotice(meta map[string]any) bool {
	var m struct {
		Notice string `json:"notice"`
	}
	return protocol.ACPMetaOf(meta, &m) && m.Notice == protocol.ACPNoticeTurnError
}

// toolStart returns the call's state, logging tool/call the first time the
// agent mentions it.
func (s *Session) toolStart(t *turnState, id, title, kind string, rawInput any) *toolState {
	if ts, ok := t.tools[id]; ok {
		return ts
	}
	name := title
	if name == "" {
		name = kind
	}
	if name == "" {
		name = "tool"
	}
	if len(name) > 200 {
		name = name[:200]
	}
	ts := &toolState{name: name, logID: s.index.CallIDs().Unique(id)}
	t.tools[id] = ts
	t.order = append(t.order, id)
	args := "{}"
	if rawInput != nil {
		if b, err := json.Marshal(rawInput); err == nil {
			args = string(b)
		}
	}
	if len(args) > s.o.ToolTextBytesMax {
		args = fmt.Sprintf(`{"omittedBytes":%d}`, len(args))
	}
	call := protocol.ToolCallData{Turn: t.turn, Step: t.step, CallID: ts.logID, Name: name, Arguments: args}
	if ts.logID != id {
		call.ModelCallID = id
	}
	t.add(protocol.EvToolCall, call)
	return ts
}

// toolEnd logs tool/result once the agent reports the call completed or failed.
func (s *Session) toolEnd(t *turnState, ts *toolState, id string, status acp.ToolCallStatus, content []acp.ToolCallContent, rawOutput any) {
	if ts.resulted || (status != acp.ToolCallStatusCompleted && status != acp.ToolCallStatusFailed) {
		return
	}
	ts.resulted = true
	var parts []string
	for _, c := range content {
		switch {
		case c.Content != nil && c.Content.Content.Text != nil:
			parts = append(parts, c.Content.Content.Text.Text)
		case c.Diff != nil:
			parts = append(parts, "diff of "+c.Diff.Path)
		case c.Terminal != nil:
			parts = append(parts, "terminal "+c.Terminal.TerminalId)
		}
	}
	if len(parts) == 0 && rawOutput != nil {
		if b, err := json.Marshal(rawOutput); err == nil {
			parts = append(parts, string(b))
		}
	}
	text := strings.Join(parts, "\n")
	if len(text) > s.o.ToolTextBytesMax {
		text = fmt.Sprintf("(the tool's output of %d bytes is not kept in the log; the limit is %d bytes)", len(text), s.o.ToolTextBytesMax)
	}
	t.add(protocol.EvToolResult, protocol.ToolResultData{
		Turn: t.turn, Step: t.step, CallID: ts.logID, Name: ts.name, Content: protocol.Text(text), IsError: status == acp.ToolCallStatusFailed,
	})
}

// turnState is one running turn, guarded by Session.mu.
type turnState struct {
	turn, step int64
	lastUpdate time.Time // the last update of this turn, or the answer
	text       strings.Builder
	overflow   bool
	tools      map[string]*toolState
	order      []string
	pending    []protocol.SessionEvent
	done       bool

	// askCtx ends with the turn (endTurn) or its context: a permission
	// request waiting for its answer (PolicyAsk) stops waiting then. asks
	// counts those requests; it is added to only under Session.mu while
	// asksClosed is false, which endTurn sets before it waits for them.
	askCtx     context.Context
	askCancel  context.CancelFunc
	asks       sync.WaitGroup
	asksClosed bool

	kick       chan struct{}
	stopWriter chan struct{}
	writerDone chan struct{}
	failed     chan struct{}
	failOnce   sync.Once
	failure    *ending
}

type toolState struct {
	name     string
	logID    string // the session-unique id the call is logged under
	resulted bool
}

func newTurnState(turn, step int64) *turnState {
	return &turnState{
		turn: turn, step: step, tools: map[string]*toolState{},
		kick: make(chan struct{}, 1), stopWriter: make(chan struct{}), writerDone: make(chan struct{}), failed: make(chan struct{}),
	}
}

// add queues an event for the writer (Session.mu held).
func (t *turnState) add(typ string, data any) {
	ev, err := protocol.NewEvent(typ, store.NowMs(), data)
	if err != nil {
		t.fail(&ending{reason: errReason(protocol.CodeInternal, "encode "+typ+": "+err.Error()), err: err, cancelRemote: true})
		return
	}
	t.pending = append(t.pending, ev)
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

func (t *turnState) fail(e *ending) {
	t.failOnce.Do(func() {
		t.failure = e
		close(t.failed)
	})
}

// evBuf collects a record's events, keeping the first encoding error.
type evBuf struct {
	evs []protocol.SessionEvent
	err error
}

func (b *evBuf) add(typ string, data any) {
	if b.err != nil {
		return
	}
	ev, err := protocol.NewEvent(typ, store.NowMs(), data)
	if err != nil {
		b.err = err
		return
	}
	b.evs = append(b.evs, ev)
}

// client is the bridge's side of the ACP connection: session updates and
// permission requests go to the session; no file system or terminal method
// is served (every client capability is false).
type client struct{ s *Session }

func (c client) SessionUpdate(_ context.Context, n acp.SessionNotification) error {
	c.s.onUpdate(n)
	return nil
}

func (c client) RequestPermission(ctx context.Context, r acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	return c.s.onPermission(ctx, r), nil
}

func (client) ReadTextFile(context.Context, acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	return acp.ReadTextFileResponse{}, acp.NewMethodNotFound(acp.ClientMethodFsReadTextFile)
}

func (client) WriteTextFile(context.Context, acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	return acp.WriteTextFileResponse{}, acp.NewMethodNotFound(acp.ClientMethodFsWriteTextFile)
}

func (client) CreateTerminal(context.Context, acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error) {
	return acp.CreateTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalCreate)
}

func (client) KillTerminal(context.Context, acp.KillTerminalRequest) (acp.KillTerminalResponse, error) {
	return acp.KillTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalKill)
}

func (client) TerminalOutput(context.Context, acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error) {
	return acp.TerminalOutputResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalOutput)
}

func (client) ReleaseTerminal(context.Context, acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	return acp.ReleaseTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalRelease)
}

func (client) WaitForTerminalExit(context.Context, acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error) {
	return acp.WaitForTerminalExitResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalWaitForExit)
}

var (
	_ provider.Session = (*Session)(nil)
	_ provider.Closer  = (*Session)(nil)
	// A continuable ACP child paused at its budget's cap survives its
	// bridge (budget.go).
	_ contract.ParkedSession = (*Session)(nil)
	_ acp.Client             = client{}
)

// ClaimNext opens the next turn with the oldest unclaimed inbox item (a
// continuable ACP child's followup, docs/design.md §4): the claim is logged before
// the turn prompts the ACP session with it.
func (s *Session) ClaimNext(ctx context.Context, in provider.Inbox) (provider.Outcome, bool, error) {
	return agent.ClaimNextOf(ctx, s, in, s.logger)
}

// Unclaimed returns the inbox items this session has not claimed yet.
func (s *Session) Unclaimed(ctx context.Context, in provider.Inbox) ([]protocol.InboxItem, error) {
	return agent.UnclaimedOf(ctx, s.InboxLog(), in, s.logger)
}

// InboxLog returns what the session's log says of its inbox items (a copy).
func (s *Session) InboxLog() provider.InboxLog {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.index.InboxLog()
}

// CloseOpenTurn returns the events that close a turn the session's log left
// open (sessionlog.CloseOpenTurn), nil when none is.
func (s *Session) CloseOpenTurn(reason protocol.TurnEndReason, nowMs int64) ([]protocol.SessionEvent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.index.CloseOpenTurn(reason, nowMs)
}

// Append logs events between turns (the continuable descriptor, the closing
// of a turn a dead host left open) as one record.
func (s *Session) Append(ctx context.Context, evs ...protocol.SessionEvent) error {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	out, ok := s.append(ctx, 0, evs)
	if ok {
		return nil
	}
	if out.Fenced {
		return provider.ErrFenced
	}
	return out.Err
}
