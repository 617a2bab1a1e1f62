package coordinator

// Who is told of a request (docs/protocol.md §5.21, "Who is told"; issue
// 33, item 4): when a request opens, the nearest ancestor of the asking
// session that takes requests gets a notice of it in its inbox, as a
// background child's settlement notice reaches its parent (durable,
// delivery next-step: it joins the ancestor's running turn at its next
// step, or starts a turn when the ancestor is idle). An ancestor takes
// requests when it is a live continuable agent (a lease that is neither
// ending nor taken over; a one-shot run's turn reads no inbox) of a
// provider whose descriptor lists the answer_request tool, and its tool
// ceiling and its own tool filter let that tool through, and it does not
// wait on the session below it: the parent of a one-shot run is passed over,
// since a built-in agent's one-shot children are its foreground subagent
// calls, and it would see the notice only once that call returned. One that
// does not take requests is passed over for its parent, up to the root,
// which is never told here:
// the root's user sees the request in requests.list (brood requests). No
// one told, or one told that does not answer: the user may still answer,
// and so may any ancestor, until the deadline. The one told is recorded as
// the request's handler; an agent may pass the request up
// (requestsPassUp), and the next one above it that takes requests (and has
// not passed it) becomes the handler and is told, or the user when none.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// requestNoticeHopsMax bounds the ancestors looked at for one notice (the
// depth of a tree is bounded far below it).
const requestNoticeHopsMax = 64

// requestNoticeArgumentsMax bounds the arguments a notice shows (requests.get
// reads them whole).
const requestNoticeArgumentsMax = 4 << 10

// noticeRequest tells rec's handler (RequestRecord.Handler: the nearest
// ancestor that took requests when it opened, or the one it was passed up
// to) of rec, in its inbox, idempotency key request-<requestId>, so an open
// asked again tells it once. Best effort: a failure is logged, and the
// request stays pending for whoever may answer it.
func (c *Coordinator) noticeRequest(ctx context.Context, rec protocol.RequestRecord) {
	if rec.State != protocol.RequestPending || rec.Handler == "" {
		return
	}
	taker, err := c.headers.get(ctx, c.st, rec.Handler)
	if err != nil {
		c.log.Warn("request notice not delivered; the request waits for the user or another ancestor", "request", rec.ID, "to", rec.Handler, "err", err)
		return
	}
	summary, content := requestNotice(rec)
	_, _, err = c.st.Enqueue(ctx, taker.Scope(), taker.ID, store.InboxItem{
		Content:  content,
		Source:   protocol.MessageSource{Kind: protocol.SourceSubagentRequest, Form: "notice", Summary: summary, SenderSessionID: rec.SessionID},
		Delivery: store.DeliveryNextStep,
	}, "request-"+rec.ID)
	if err != nil {
		c.log.Warn("request notice not delivered; the request waits for the user or another ancestor", "request", rec.ID, "to", taker.ID, "err", err)
		return
	}
	c.log.Info("request notice delivered", "request", rec.ID, "session", rec.SessionID, "to", taker.ID)
}

// requestHandler returns the id of the nearest ancestor of session id
// that takes requests and is not in passed (the agents that passed the
// request up: one told again would only pass it again), or "" when none
// below the root does: the request waits on the user.
func (c *Coordinator) requestHandler(ctx context.Context, id string, passed []string) string {
	for range requestNoticeHopsMax {
		taker, ok := c.requestTaker(ctx, id)
		if !ok {
			return ""
		}
		if !slices.Contains(passed, taker.ID) {
			return taker.ID
		}
		id = taker.ID
	}
	return ""
}

// requestTaker returns the header of the nearest ancestor of session id
// that takes requests, if any below its root.
func (c *Coordinator) requestTaker(ctx context.Context, id string) (protocol.SessionHeader, bool) {
	h, err := c.headers.get(ctx, c.st, id)
	if err != nil {
		return protocol.SessionHeader{}, false
	}
	below := "" // the kind of the agent of h, the session below the next
	if l, err := c.st.Lease(ctx, id); err == nil {
		below = l.Value.Kind
	}
	for range requestNoticeHopsMax {
		if h.ParentSession == "" || h.Origin == protocol.OriginReopenable {
			return protocol.SessionHeader{}, false // a root: its user's
		}
		if h, err = c.headers.get(ctx, c.st, h.ParentSession); err != nil {
			return protocol.SessionHeader{}, false
		}
		takes, kind := c.takesRequests(ctx, h)
		if takes && below != protocol.AgentOneShot {
			return h, true
		}
		below = kind
	}
	return protocol.SessionHeader{}, false
}

// takesRequests reports whether session h may take requests, a live
// continuable agent that may call answer_request, and the kind of its
// agent ("" with none).
func (c *Coordinator) takesRequests(ctx context.Context, h protocol.SessionHeader) (bool, string) {
	if h.Provider == "" {
		return false, ""
	}
	l, err := c.st.Lease(ctx, h.ID)
	if err != nil || l.Value.Provider != h.Provider {
		return false, ""
	}
	kind := l.Value.Kind
	if kind != protocol.AgentContinuable || !c.leaseLive(l.Value) || !h.ToolCeiling.Allows(protocol.ToolAnswerRequest) {
		return false, kind
	}
	if desc, ok := c.reg.Provider(h.Provider); !ok || !slices.Contains(desc.Tools, protocol.ToolAnswerRequest) {
		return false, kind
	}
	d, err := c.resumable(ctx, h) // its descriptor event: its own tool filter
	return err == nil && d.ToolFilter.Allows(protocol.ToolAnswerRequest), kind
}

// requestNotice is the one-line account and the content of the notice of
// rec: who asks what, and how to answer.
func requestNotice(rec protocol.RequestRecord) (string, []protocol.ContentBlock) {
	var b strings.Builder
	var line string
	passed := ""
	if n := len(rec.PassedBy); n > 0 {
		passed = fmt.Sprintf(" Passed up to you by agent %s.", rec.PassedBy[n-1])
	}
	switch rec.Kind {
	case protocol.RequestBudget:
		line = fmt.Sprintf("Subagent %s is paused at its budget's cap (request %s).%s", rec.SessionID, rec.ID, passed)
		fmt.Fprintf(&b, "%s\n%s\n", line, rec.Exhausted)
		fmt.Fprintf(&b, "Its parent or the user raises its budget (budget.raise; brood budget %s --raise tokens=+N), and its turn goes on. ", rec.SessionID)
		fmt.Fprintf(&b, `To end its turn instead, call %s {"requestId":%q,"decision":"deny"} with a "reason" the subagent sees.`, protocol.ToolAnswerRequest, rec.ID)
	case protocol.RequestQuestion:
		line = fmt.Sprintf("Subagent %s asks a question (request %s).%s", rec.SessionID, rec.ID, passed)
		fmt.Fprintf(&b, "%s\nQuestion:\n%s\n", line, rec.Question)
		switch {
		case len(rec.Choices) > 0:
			q, _ := json.Marshal(rec.Choices)
			fmt.Fprintf(&b, "Choices (answer with exactly one, as text): %s\n", q)
		case rec.AnswerSchema != "":
			fmt.Fprintf(&b, "Answer with JSON this schema accepts (json): %s\n", rec.AnswerSchema)
		}
		fmt.Fprintf(&b, `To answer, call %s {"requestId":%q,"decision":"answer","text":"..."}`, protocol.ToolAnswerRequest, rec.ID)
		b.WriteString(` (or "json" instead of "text").`)
	default:
		line = fmt.Sprintf("Subagent %s asks for approval to run %s (request %s).%s", rec.SessionID, rec.Tool, rec.ID, passed)
		args := rec.Arguments
		if len(args) > requestNoticeArgumentsMax {
			args = strings.ToValidUTF8(args[:requestNoticeArgumentsMax], "") + " … (cut; the whole arguments are in the request)"
		}
		fmt.Fprintf(&b, "%s\nArguments: %s\n", line, args)
		fmt.Fprintf(&b, `To answer, call %s {"requestId":%q,"decision":"approve"}, or "deny" with a "reason" the subagent sees.`, protocol.ToolAnswerRequest, rec.ID)
	}
	fmt.Fprintf(&b, "\nTo leave the decision to the agent above you (or the user), call %s {\"requestId\":%q,\"decision\":%q}.", protocol.ToolAnswerRequest, rec.ID, protocol.AnswerPassUp)
	fmt.Fprintf(&b, "\nIf you leave it unanswered, the user (or another ancestor) may answer it; unanswered by %s, it times out, which counts as a denial.",
		time.UnixMilli(rec.Deadline).UTC().Format(time.RFC3339))
	return line, protocol.Text(b.String())
}
