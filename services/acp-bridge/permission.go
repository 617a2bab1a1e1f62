package acpbridge

import (
	"context"
	"encoding/json"
	"fmt"

	acp "github.com/coder/acp-go-sdk"

	"github.com/brood-dev/brood/internal/requestwait"
	"github.com/brood-dev/brood/pkg/protocol"
)

func ceilingDeniesAny(c *protocol.ToolFilter) bool {
	return c != nil && (c.Allow != nil || len(c.Deny) > 0)
}

// Option kinds in the order each decision prefers them (docs/protocol.md
// §8.8, "ACP permissions"): the narrowest grant or refusal first.
var (
	preferAllow  = []acp.PermissionOptionKind{acp.PermissionOptionKindAllowOnce, acp.PermissionOptionKindAllowAlways}
	preferReject = []acp.PermissionOptionKind{acp.PermissionOptionKindRejectOnce, acp.PermissionOptionKindRejectAlways}
)

// onPermission answers a permission request (docs/protocol.md §8.8, "ACP
// permissions"). Under the reject and allow policies nobody is asked
// (docs/upstream-behaviour.md §4): reject selects the agent's reject_once
// (else reject_always) option, allow its allow_once (else allow_always)
// option. Under ask the request is routed to whoever may answer for the
// child as a request for approval (ask), and the answer selects the same
// options: approved as allow, denied or timed out as reject; a turn that
// ends while the request waits answers `cancelled`. The `cancelled`
// outcome is also the answer when no offered option fits. A child whose
// tool ceiling denies any tool has every request rejected (fail closed,
// docs/design.md §7), and so has a request that arrives when no turn is
// running (the turn it belongs to is over), whatever the policy. Every
// request and its answer is logged (acp/permission) and counted in the
// result (issue 14). ctx is the request's own (the SDK ends it when the
// agent withdraws the request or the connection closes).
func (s *Session) onPermission(ctx context.Context, req acp.RequestPermissionRequest) acp.RequestPermissionResponse {
	policy, why := s.p.agent.Permission, "provider policy"
	if ceilingDeniesAny(s.header.ToolCeiling) {
		policy, why = PolicyReject, "the child's tool ceiling denies tools"
	}
	s.mu.Lock()
	t := s.cur
	late := t == nil || t.done || t.asksClosed
	var call askedCall
	if late {
		policy, why = PolicyReject, "no turn is running: the turn it belongs to is over"
	} else if policy == PolicyAsk {
		call = s.startAsk(t, req.ToolCall)
	}
	s.mu.Unlock()
	prefer := preferReject
	switch policy {
	case PolicyAllow:
		prefer = preferAllow
	case PolicyAsk:
		prefer, why = s.ask(ctx, t, call)
	}
	d := protocol.ACPPermissionData{ToolCallID: string(req.ToolCall.ToolCallId), Policy: string(policy), Why: why, Outcome: "cancelled",
		Options: make([]protocol.ACPPermissionOption, 0, len(req.Options))}
	if req.ToolCall.Title != nil {
		d.Title = *req.ToolCall.Title
	}
	for _, o := range req.Options {
		d.Options = append(d.Options, protocol.ACPPermissionOption{OptionID: string(o.OptionId), Kind: string(o.Kind), Name: o.Name})
	}
	resp := acp.RequestPermissionResponse{Outcome: acp.RequestPermissionOutcome{Cancelled: &acp.RequestPermissionOutcomeCancelled{}}}
	if o, ok := pickOption(req.Options, prefer); ok {
		resp.Outcome = acp.RequestPermissionOutcome{Selected: &acp.RequestPermissionOutcomeSelected{OptionId: o.OptionId}}
		d.Outcome, d.OptionID, d.OptionKind = "selected", string(o.OptionId), string(o.Kind)
		d.Granted = o.Kind == acp.PermissionOptionKindAllowOnce || o.Kind == acp.PermissionOptionKindAllowAlways
	} else if len(prefer) > 0 {
		d.Why += "; the agent offered no option of kind " + string(prefer[0]) + " or " + string(prefer[1])
	}
	s.mu.Lock()
	if !late && !t.done {
		// An asked request is logged in its own turn even when that turn
		// ended while it waited: endTurn waits for it (t.asks) before it
		// marks the turn done and writes its last record.
		d.Turn, d.Step = t.turn, t.step
		t.add(protocol.EvACPPermission, d)
	} else {
		d.Turn, d.Late = s.sealed, true
		s.queueLate(lateItem{perm: &d})
	}
	s.mu.Unlock()
	if policy == PolicyAsk && !late {
		s.endAsk(t)
	}
	s.logger.Info("ACP permission request answered", "toolCallId", d.ToolCallID, "outcome", d.Outcome, "option", d.OptionID, "granted", d.Granted, "why", d.Why)
	return resp
}

// pickOption returns the first option of the first kind in prefer that the
// agent offered.
func pickOption(opts []acp.PermissionOption, prefer []acp.PermissionOptionKind) (acp.PermissionOption, bool) {
	for _, kind := range prefer {
		for _, o := range opts {
			if o.Kind == kind {
				return o, true
			}
		}
	}
	return acp.PermissionOption{}, false
}

// askedCall is the tool call a permission request asks about, as the
// request for approval names it.
type askedCall struct {
	callID    string // the session-unique id the call is logged under
	tool      string
	arguments string
	turn      int64
	step      int64
}

// startAsk registers a permission request that is about to wait for an
// answer (Session.mu held, t current and not closed): the tool call is
// logged (tool/call) when the agent had not reported it, so the request
// names a logged call, and the turn's end waits for the request.
func (s *Session) startAsk(t *turnState, c acp.ToolCallUpdate) askedCall {
	var title, kind string
	if c.Title != nil {
		title = *c.Title
	}
	if c.Kind != nil {
		kind = string(*c.Kind)
	}
	ts := s.toolStart(t, string(c.ToolCallId), title, kind, c.RawInput)
	t.asks.Add(1)
	s.asking.Add(1)
	return askedCall{callID: ts.logID, tool: ts.name, arguments: permissionArguments(c, min(s.o.ToolTextBytesMax, protocol.RequestArgumentsBytesMax)),
		turn: t.turn, step: t.step}
}

// endAsk ends what startAsk registered; the agent's silence counts again
// from now.
func (s *Session) endAsk(t *turnState) {
	s.touch()
	s.asking.Add(-1)
	t.asks.Done()
}

// permissionArguments is the JSON text a request for approval shows of the
// tool call asked about: its raw input when the agent sent one, else what
// it sent of the call's content and locations ({} when nothing); one of
// more than bytesMax bytes is {"omittedBytes":N}, as in its tool/call.
func permissionArguments(c acp.ToolCallUpdate, bytesMax int) string {
	v := c.RawInput
	if v == nil {
		m := map[string]any{}
		if len(c.Content) > 0 {
			m["content"] = c.Content
		}
		if len(c.Locations) > 0 {
			m["locations"] = c.Locations
		}
		v = m
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "{}"
	}
	if len(b) > bytesMax {
		return fmt.Sprintf(`{"omittedBytes":%d}`, len(b))
	}
	return string(b)
}

// ask routes a permission request to whoever may answer for the child
// (PolicyAsk; docs/protocol.md §5.21): it opens a request for approval of
// call with the child's own credential, logs request/open, waits for the
// answer and logs request/answer (park), as a built-in agent's parked
// tool call does. It returns the option kinds the answer prefers (allow
// when approved, reject when denied, timed out or when no request could
// be opened or read) and why; no kinds (the `cancelled` outcome) when the
// turn ended, or the agent withdrew the request, while it waited, or the
// request was cancelled because its turn ended. While it waits it holds
// the SDK's request goroutine and nothing of the turn but its place: the
// agent waits for the answer, so its silence is not held against it
// (Session.await).
func (s *Session) ask(ctx context.Context, t *turnState, call askedCall) ([]acp.PermissionOptionKind, string) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(t.askCtx, cancel)()
	record := func(typ string, data any) error {
		s.mu.Lock()
		t.add(typ, data)
		s.mu.Unlock()
		return nil
	}
	rec, d, stage, err := s.park(wctx, protocol.RequestOpenRequest{
		Kind: protocol.RequestApproval, CallID: call.callID, Turn: call.turn, Step: call.step, Tool: call.tool, Arguments: call.arguments,
	}, nil, record, func(o protocol.RequestOpenData) {
		s.logger.Info("ACP permission request parked on a request", "request", o.RequestID, "tool", call.tool, "call", call.callID)
	})
	switch stage {
	case parkOpened:
		if wctx.Err() != nil {
			return nil, "the turn ended before the request for approval was opened"
		}
		return preferReject, fmt.Sprintf("the request for approval could not be opened (%v), which counts as a denial", err)
	case parkEnded:
		if wctx.Err() != nil {
			return nil, fmt.Sprintf("the turn ended while request %s waited for its answer", rec.ID)
		}
		return preferReject, fmt.Sprintf("request %s could not be read (%v), which counts as a denial", rec.ID, err)
	}
	switch rec.State {
	case protocol.RequestApproved:
		return preferAllow, fmt.Sprintf("request %s was approved by %s", rec.ID, requestwait.AnswererName(d.By))
	case protocol.RequestTimedOut:
		return preferReject, fmt.Sprintf("request %s timed out, which counts as a denial", rec.ID)
	case protocol.RequestCancelled:
		// Its turn ended (the coordinator read its turn/end): the
		// agent's prompt is being cancelled too.
		return nil, fmt.Sprintf("request %s was cancelled: %s", rec.ID, d.Reason)
	case protocol.RequestDenied:
		why := fmt.Sprintf("request %s was denied by %s", rec.ID, requestwait.AnswererName(d.By))
		if d.Reason != "" {
			why += ": " + d.Reason
		}
		return preferReject, why
	default:
		return preferReject, fmt.Sprintf("request %s ended %s, which counts as a denial", rec.ID, rec.State)
	}
}

// parkStage is how far a park got when it failed (0: the request was
// answered and its records logged).
type parkStage int

const (
	parkOpened parkStage = iota + 1 // the request could not be opened
	parkLogged                      // its request/open or request/answer could not be logged
	parkEnded                       // the wait ended (ctx, or a read said the request is gone or not the child's) before an answer
)

// park waits for the answer to a request of the child's (docs/protocol.md
// §5.21), as the child itself (req.Self is set here): it opens req and
// logs its request/open with record — or, with parked, reads again the
// request the session's previous host opened and logged, at once — calls
// opened with the logged request/open, waits for the answer
// (requestwait.Await) and logs its request/answer with record. A
// permission request under PolicyAsk (ask) and a turn paused at its
// budget's cap (budgetPause) park so. rec is the request as last read, d
// its answer as logged.
func (s *Session) park(ctx context.Context, req protocol.RequestOpenRequest, parked *protocol.RequestOpenData,
	record func(typ string, data any) error, opened func(protocol.RequestOpenData)) (rec protocol.RequestRecord, d protocol.RequestAnswerData, stage parkStage, err error) {
	req.Self = protocol.ParentRef{SessionID: s.header.ID, Credential: s.cred}
	first := requestwait.PollInterval
	var open protocol.RequestOpenData
	if parked != nil {
		rec = protocol.RequestRecord{ID: parked.RequestID, SessionID: req.Self.SessionID, CallID: parked.CallID, Kind: parked.Kind, State: protocol.RequestPending}
		open, first = *parked, 0
	} else {
		if rec, err = requestwait.Open(ctx, s.o.Requests, req); err != nil {
			return rec, d, parkOpened, err
		}
		open = protocol.RequestOpenData{RequestID: rec.ID, Kind: rec.Kind, Turn: req.Turn, Step: req.Step,
			CallID: req.CallID, Tool: req.Tool, Deadline: rec.Deadline}
		if err = record(protocol.EvRequestOpen, open); err != nil {
			return rec, d, parkLogged, err
		}
	}
	opened(open)
	if rec, err = requestwait.Await(ctx, s.o.Requests, req.Self, rec, first, s.logger); err != nil {
		return rec, d, parkEnded, err
	}
	d = requestwait.AnswerData(rec, open.CallID)
	if err = record(protocol.EvRequestAnswer, d); err != nil {
		return rec, d, parkLogged, err
	}
	return rec, d, 0, nil
}
