package acpagent

// The editor answers its tree's requests (docs/protocol.md §5.21 "The
// editor answers"; issue 33, item 4): while an ACP session's root has
// started children, the session lists its tree's pending requests
// (requests.list with the root's credential: the root's descendants') and
// asks the editor about each with session/request_permission, in that
// session; the editor's choice becomes requests.answer with a user grant
// this process mints (the editor's user answers, as with brood approve).
//
// How it learns of requests: a poll of requests.list, from the first call
// of a tool that starts children (agent.Tool.Delegates, the subagent tool)
// on, in this process or in the loaded log, until the session closes;
// every RequestPollMin right after such a call or a new request, the wait
// doubling to RequestPollMax while nothing new is pending. The request
// records are durable (brood_agents), so a new process that loads the
// session asks again about every request still pending; the one that died
// took its outstanding session/request_permission with its connection.
//
// Exactly one outstanding session/request_permission per request and
// session: a request asked about is not asked again while it is pending,
// whatever the editor answered (a cancelled outcome leaves it pending for
// brood approve, deny or answer, or the web view). A request that leaves
// pending while the editor is asked (another answer won, or it timed out)
// has its session/request_permission cancelled ($/cancel_request), and an
// editor's answer that comes anyway loses quietly (ALREADY_ANSWERED).
//
// A question without choices (free text, or JSON for an answerSchema) is
// not asked, since an editor's options cannot carry its answer: it is shown
// as a pending tool call that says how to answer it (brood answer), and
// completed once it is no longer pending.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	acp "github.com/coder/acp-go-sdk"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Bounds of the editor's requests.
const (
	// RequestPollMin is the wait before the next requests.list right after
	// a delegating tool call or a newly pending request (250 ms).
	RequestPollMin = 250 * time.Millisecond
	// RequestPollMax is the longest wait between two requests.list of a
	// session while nothing new is pending (3 s): the most an editor waits
	// to be asked about a request, as coordinators answer the list.
	RequestPollMax = 3 * time.Second
	// RequestAsksMax bounds the session/request_permission outstanding at
	// once in one ACP session (16); more pending requests wait for a free
	// one, oldest first.
	RequestAsksMax = 16
	// requestAnswerAttemptsMax bounds the tries of one editor's answer when
	// a coordinator is unavailable or the cached grant expired (3).
	requestAnswerAttemptsMax = 3
	// requestAnswerTimeout bounds what follows the editor's choice: the
	// answer's tries and the reads that tell the editor the outcome (20 s).
	requestAnswerTimeout = 20 * time.Second
	// requestShownBytesMax bounds the arguments or question text shown in
	// the tool call's content (4 KiB; rawInput carries them whole).
	requestShownBytesMax = 4 << 10
	// grantMarginMs: a cached user grant is minted again this long before
	// it expires (60 s).
	grantMarginMs = 60_000
)

// Option ids of session/request_permission: an approval's, and a question
// choice's prefix (followed by the choice's index).
const (
	optionApprove = "approve"
	optionDeny    = "deny"
	optionChoice  = "choice-"
)

// errNotPending cancels an outstanding session/request_permission whose
// request left pending.
var errNotPending = errors.New("the request is no longer pending")

// requestsState is a session's view of its tree's requests.
type requestsState struct {
	mu sync.Mutex
	// delegates: the session started children, so its tree may ask.
	delegates bool
	// asking maps a request id to the cancel of its outstanding
	// session/request_permission.
	asking map[string]context.CancelCauseFunc
	// asked holds the requests the editor was asked about (or that it
	// cannot answer: a free-text or JSON question) while they are pending,
	// so none is asked twice; dropped once the list no longer has them.
	asked map[string]bool
	// shown holds the questions without choices shown to the editor (not
	// asked) while they are pending.
	shown map[string]bool
	wake  chan struct{} // capacity 1: a delegating call was logged
}

func newRequestsState() *requestsState {
	return &requestsState{asking: map[string]context.CancelCauseFunc{}, asked: map[string]bool{}, shown: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// delegated records that the session started (or starts) children.
func (rs *requestsState) delegated() {
	rs.mu.Lock()
	rs.delegates = true
	rs.mu.Unlock()
	select {
	case rs.wake <- struct{}{}:
	default:
	}
}

// watchRequests polls the tree's pending requests until ctx ends, and asks
// the editor about each new one. Until the session delegates it waits for
// that, listing nothing.
func (ss *session) watchRequests(ctx context.Context) {
	rs := ss.requests
	log := ss.s.log.With("session", ss.id)
	wait := RequestPollMin
	var failing bool
	for ctx.Err() == nil {
		rs.mu.Lock()
		on := rs.delegates
		rs.mu.Unlock()
		if !on {
			select {
			case <-ctx.Done():
			case <-rs.wake:
			}
			continue
		}
		fresh, err := ss.pollRequests(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing {
				log.Warn("could not list the tree's requests; retrying", "err", err)
			}
			failing = true
			wait = RequestPollMax
		case fresh:
			failing = false
			wait = RequestPollMin
		default:
			failing = false
			wait = min(2*wait, RequestPollMax)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-rs.wake:
			wait = RequestPollMin
		case <-t.C:
		}
		t.Stop()
	}
}

// pollRequests lists the pending requests of the root's descendants, cancels
// the asks of those no longer pending, and asks about the new ones; fresh
// reports whether it asked about (or showed) any. A question the editor
// cannot answer (no choices) is shown as a pending tool call that says how
// to answer it, and completed once it is no longer pending.
func (ss *session) pollRequests(ctx context.Context) (fresh bool, err error) {
	l, err := ss.s.cfg.Client.Requests(ctx, protocol.RequestsListRequest{Authority: ss.root.Authority()})
	if err != nil {
		return false, err
	}
	rs := ss.requests
	pending := make(map[string]bool, len(l.Requests))
	for _, r := range l.Requests {
		pending[r.ID] = true
	}
	var show []acp.ToolCallUpdate // the questions to show, not ask
	var left []string             // the shown questions no longer pending
	rs.mu.Lock()
	for id, cancel := range rs.asking {
		if !pending[id] {
			cancel(errNotPending) // answered elsewhere, or timed out: the editor is told to drop it
		}
	}
	for id := range rs.asked {
		if !pending[id] {
			delete(rs.asked, id)
		}
	}
	for id := range rs.shown {
		if !pending[id] {
			delete(rs.shown, id)
			left = append(left, id)
		}
	}
	for _, r := range l.Requests {
		if rs.asked[r.ID] {
			continue
		}
		if len(rs.asking) >= RequestAsksMax {
			break
		}
		rs.asked[r.ID] = true
		fresh = true
		perm, askable := permissionRequest(ss.id, r)
		if !askable {
			rs.shown[r.ID] = true
			show = append(show, perm.ToolCall)
			continue
		}
		actx, cancel := context.WithCancelCause(ctx)
		rs.asking[r.ID] = cancel
		ss.watching.Add(1)
		go func() {
			defer ss.watching.Done()
			defer func() {
				rs.mu.Lock()
				delete(rs.asking, r.ID)
				rs.mu.Unlock()
				cancel(nil)
			}()
			ss.ask(actx, r, perm)
		}()
	}
	rs.mu.Unlock()
	for _, tc := range show {
		ss.notify(startOf(tc))
	}
	for _, id := range left {
		if now, err := ss.s.cfg.Client.GetRequest(ctx, protocol.RequestGetRequest{RequestID: id, Authority: ss.root.Authority()}); err == nil && now.State != protocol.RequestPending {
			ss.notify(outcomeOf(acp.ToolCallId(requestCallPrefix+id), acp.ToolCallStatusCompleted, "answered elsewhere: "+decided(now)))
		}
	}
	return fresh, nil
}

// startOf is the tool_call update (status pending) that shows tc.
func startOf(tc acp.ToolCallUpdate) acp.SessionUpdate {
	u := acp.StartToolCall(tc.ToolCallId, *tc.Title, acp.WithStartKind(*tc.Kind), acp.WithStartStatus(acp.ToolCallStatusPending),
		acp.WithStartRawInput(tc.RawInput), acp.WithStartContent(tc.Content))
	u.ToolCall.Meta = tc.Meta
	return u
}

// outcomeOf is the tool_call_update that ends a request's tool call with text.
func outcomeOf(id acp.ToolCallId, status acp.ToolCallStatus, text string) acp.SessionUpdate {
	return acp.UpdateToolCall(id, acp.WithUpdateStatus(status), acp.WithUpdateContent([]acp.ToolCallContent{acp.ToolContent(acp.TextBlock(text))}))
}

// ask asks the editor about request r and answers it with the editor's
// choice. The editor first sees the request as a pending tool call, then
// the permission request on it, then the outcome on the same tool call.
func (ss *session) ask(ctx context.Context, r protocol.RequestRecord, perm acp.RequestPermissionRequest) {
	log := ss.s.log.With("session", ss.id, "request", r.ID)
	tc := perm.ToolCall
	ss.notify(startOf(tc))
	resp, err := ss.s.conn.RequestPermission(ctx, perm)
	outcome := func(status acp.ToolCallStatus, text string) { ss.notify(outcomeOf(tc.ToolCallId, status, text)) }
	// What follows the editor's choice is bounded on its own: the answer
	// is sent even when the session starts closing meanwhile.
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestAnswerTimeout)
	defer cancel()
	switch {
	case ctx.Err() != nil:
		// No longer pending: what became of it. (The session closing: nothing.)
		if context.Cause(ctx) != errNotPending {
			return
		}
		if now, gerr := ss.s.cfg.Client.GetRequest(octx, protocol.RequestGetRequest{RequestID: r.ID, Authority: ss.root.Authority()}); gerr == nil && now.State != protocol.RequestPending {
			outcome(acp.ToolCallStatusCompleted, "answered elsewhere: "+decided(now))
		}
		return
	case err != nil:
		log.Warn("the editor did not answer session/request_permission; the request stays pending", "err", err)
		outcome(acp.ToolCallStatusFailed, "not answered in the editor; it stays pending: "+howToAnswer(r))
		return
	case resp.Outcome.Selected == nil:
		outcome(acp.ToolCallStatusFailed, "cancelled in the editor; it stays pending: "+howToAnswer(r))
		return
	}
	req := protocol.RequestAnswerRequest{RequestID: r.ID}
	id := string(resp.Outcome.Selected.OptionId)
	switch {
	case r.Kind == protocol.RequestApproval && id == optionApprove:
		req.Answer = protocol.AnswerApprove
	case r.Kind == protocol.RequestApproval && id == optionDeny:
		req.Answer, req.Reason = protocol.AnswerDeny, "denied in the editor"
	case r.Kind == protocol.RequestQuestion && strings.HasPrefix(id, optionChoice):
		var i int
		if _, err := fmt.Sscanf(id[len(optionChoice):], "%d", &i); err == nil && i >= 0 && i < len(r.Choices) && id == fmt.Sprintf("%s%d", optionChoice, i) {
			req.Answer, req.Text = protocol.AnswerAnswer, r.Choices[i]
		}
	}
	if req.Answer == "" {
		log.Warn("the editor chose an option that was not offered; the request stays pending", "option", id)
		outcome(acp.ToolCallStatusFailed, fmt.Sprintf("option %q was not offered; it stays pending: %s", id, howToAnswer(r)))
		return
	}
	now, err := ss.answer(octx, req)
	switch {
	case err == nil:
		outcome(acp.ToolCallStatusCompleted, decided(now))
	case protocol.AsError(err).Code == protocol.CodeAlreadyAnswered:
		// Someone else answered first (or it timed out): theirs stands.
		log.Debug("the editor's answer came second", "err", err)
		if now, gerr := ss.s.cfg.Client.GetRequest(octx, protocol.RequestGetRequest{RequestID: r.ID, Authority: ss.root.Authority()}); gerr == nil {
			outcome(acp.ToolCallStatusCompleted, "answered elsewhere first: "+decided(now))
		}
	default:
		log.Warn("the editor's answer was not taken; the request stays pending", "err", err)
		outcome(acp.ToolCallStatusFailed, "the answer was not taken ("+err.Error()+"); "+howToAnswer(r))
	}
}

// answer sends the editor's answer with a user grant, minting it again
// when the cached one was refused, and trying again while no coordinator
// answers (requestAnswerAttemptsMax tries in all).
func (ss *session) answer(ctx context.Context, req protocol.RequestAnswerRequest) (protocol.RequestRecord, error) {
	var err error
	for attempt := range requestAnswerAttemptsMax {
		if attempt > 0 {
			sleep(ctx, time.Duration(attempt)*RequestPollMax/3)
		}
		var auth protocol.Authority
		if auth, err = ss.s.userGrant(ctx); err != nil {
			continue
		}
		req.Authority = auth
		rec, err := ss.s.cfg.Client.AnswerRequest(ctx, req)
		if err == nil {
			return rec, nil
		}
		switch protocol.AsError(err).Code {
		case protocol.CodeUnauthorized:
			ss.s.dropGrant(auth.Grant)
		case protocol.CodeUnavailable:
		default:
			return protocol.RequestRecord{}, err
		}
	}
	return protocol.RequestRecord{}, err
}

// userGrant returns a user grant (authority.user, minted on this process's
// own subject: the trees of the roots its user opened), cached until
// grantMarginMs before it expires.
func (s *Service) userGrant(ctx context.Context) (protocol.Authority, error) {
	s.mu.Lock()
	g := s.grant
	s.mu.Unlock()
	if g.Grant != "" && time.Now().UnixMilli() < g.ExpiresAt-grantMarginMs {
		return protocol.Authority{Grant: g.Grant}, nil
	}
	g, err := s.cfg.Client.UserGrant(ctx)
	if err != nil {
		return protocol.Authority{}, err
	}
	s.mu.Lock()
	s.grant = g
	s.mu.Unlock()
	return protocol.Authority{Grant: g.Grant}, nil
}

// dropGrant forgets the cached grant when it is g (refused: expired).
func (s *Service) dropGrant(g string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grant.Grant == g {
		s.grant = protocol.UserGrantReply{}
	}
}

// requestCallPrefix prefixes a request's id to name the tool call that
// stands for it in the editor.
const requestCallPrefix = "request-"

// permissionRequest is the session/request_permission of request r in ACP
// session id: the tool call it stands for (id "request-<requestId>", the
// asking session and the tool with its arguments, or the question; its
// _meta.brood names the request) and the options: allow_once "approve" and
// reject_once "deny" for an approval, one allow_once "choice-<i>" per
// choice for a question with choices. A question without choices (free
// text, or JSON for its answerSchema) has no options an editor could
// offer: askable is false, and the tool call says how to answer it.
func permissionRequest(id string, r protocol.RequestRecord) (_ acp.RequestPermissionRequest, askable bool) {
	var title, shown string
	var raw any
	kind := acp.ToolKindOther
	var options []acp.PermissionOption
	switch r.Kind {
	case protocol.RequestApproval:
		title = fmt.Sprintf("Subagent %s asks to run %s", r.SessionID, r.Tool)
		shown = "Arguments: " + cut(r.Arguments, requestShownBytesMax)
		if json.Unmarshal([]byte(r.Arguments), &raw) != nil {
			raw = r.Arguments
		}
		kind = toolKind(r.Tool)
		options = []acp.PermissionOption{
			{OptionId: optionApprove, Name: "Approve", Kind: acp.PermissionOptionKindAllowOnce},
			{OptionId: optionDeny, Name: "Deny", Kind: acp.PermissionOptionKindRejectOnce},
		}
	case protocol.RequestBudget:
		// No option an editor could offer raises a budget: the tool call
		// says how (docs/protocol.md §5.5, "Pause and raise").
		title = fmt.Sprintf("Subagent %s is paused at its budget's cap", r.SessionID)
		shown = cut(r.Exhausted, requestShownBytesMax) + "\n\nRaise it and its turn goes on: " + howToAnswer(r) + ", or in the web view."
		raw = map[string]any{"budgetOf": r.BudgetOf, "exhausted": r.Exhausted}
		kind = acp.ToolKindOther
	default: // a question
		title = fmt.Sprintf("Subagent %s asks a question", r.SessionID)
		shown = cut(r.Question, requestShownBytesMax)
		q := map[string]any{"question": r.Question}
		for i, c := range r.Choices {
			options = append(options, acp.PermissionOption{OptionId: acp.PermissionOptionId(fmt.Sprintf("%s%d", optionChoice, i)), Name: c, Kind: acp.PermissionOptionKindAllowOnce})
		}
		switch {
		case len(r.Choices) > 0:
			q["choices"] = r.Choices
		case r.AnswerSchema != "":
			q["answerSchema"] = json.RawMessage(r.AnswerSchema)
			shown += "\n\nAnswer with JSON for its schema: brood answer " + r.ID + " --json FILE, or in the web view."
		default:
			shown += "\n\nAnswer with: brood answer " + r.ID + " TEXT, or in the web view."
		}
		raw = q
		kind = acp.ToolKindThink
	}
	status := acp.ToolCallStatusPending
	meta := map[string]any{protocol.ACPMetaKey: map[string]any{
		"requestId": r.ID, "sessionId": r.SessionID, "kind": r.Kind, "deadline": r.Deadline}}
	return acp.RequestPermissionRequest{
		SessionId: acp.SessionId(id),
		Options:   options,
		Meta:      meta,
		ToolCall: acp.ToolCallUpdate{
			ToolCallId: acp.ToolCallId(requestCallPrefix + r.ID), Title: &title, Kind: &kind, Status: &status, RawInput: raw,
			Content: []acp.ToolCallContent{acp.ToolContent(acp.TextBlock(shown))}, Meta: meta,
		},
	}, len(options) > 0
}

// decided says how a request ended, for the editor.
func decided(r protocol.RequestRecord) string {
	if r.Answer == nil {
		return r.State
	}
	by := r.Answer.By.Kind
	if r.Answer.By.SessionID != "" {
		by += " " + r.Answer.By.SessionID
	}
	out := r.State + " (by " + by + ")"
	switch {
	case r.Answer.Text != "":
		out += ": " + cut(r.Answer.Text, requestShownBytesMax)
	case r.Answer.JSON != "":
		out += ": " + cut(r.Answer.JSON, requestShownBytesMax)
	case r.Answer.Reason != "":
		out += ": " + r.Answer.Reason
	}
	return out
}

// howToAnswer names the commands that answer r outside the editor.
func howToAnswer(r protocol.RequestRecord) string {
	if r.Kind == protocol.RequestBudget {
		return "brood budget " + r.SessionID + " --raise tokens=+N (brood deny " + r.ID + " ends its turn)"
	}
	if r.Kind == protocol.RequestQuestion {
		return "brood answer " + r.ID + " TEXT"
	}
	return "brood approve " + r.ID + ", or brood deny " + r.ID + " --reason TEXT"
}

// cut returns s, or its first n bytes (at a UTF-8 boundary) marked as cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + " …[truncated]"
}
