package coordinator

// Requests (docs/protocol.md §5.21; issue 33): a child asks for the approval
// of a tool call, or asks a question (its ask tool), and parks the call
// until the request is answered. The
// record is brood_agents request.<id> (store.RequestKey), which only
// coordinators write:
//
//	requests.open    the child, with its own credential: create the record
//	                 pending (again: the same record, its id is the call's)
//	requests.answer  the user (a grant over the child's tree) or an ancestor
//	                 (its live credential), never the child nor a sibling:
//	                 compare-and-set pending → approved|denied (an
//	                 approval) or answered (a question, its answer
//	                 checked first); a later answer is ALREADY_ANSWERED;
//	                 an ancestor agent may pass it up instead (pass_up,
//	                 requestpass.go)
//	requests.get     the child or one who may answer
//	requests.list    what the caller may answer, pending unless all
//
// A pending request whose asking turn ended (its run settled, its turn
// closed) is moved to cancelled when one who may answer reads it
// (requestended.go): no answer can reach the call any more.
//
// An opened request is told to the nearest ancestor that takes requests
// (requestnotice.go), which may answer with its answer_request tool.
//
// A pending request past its deadline is moved to timed-out (a denial that
// no one gave) by the first of these to read it, by the same
// compare-and-set, so a late answer loses to the timeout as to any answer.
//
// An answer (or a timeout) wakes the asking child when no live activation
// holds it (wakeParked): its host died while the call waited, and its next
// activation continues the parked turn from the log (resume.go).

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Bounds of a request's fields (INVALID_ARGUMENT past them; LIMIT_EXCEEDED
// past the arguments').
const (
	requestCallIDBytesMax    = protocol.RequestCallIDBytesMax
	requestToolBytesMax      = protocol.RequestToolBytesMax
	requestArgumentsBytesMax = protocol.RequestArgumentsBytesMax
)

// requestsOpen creates the pending request of the caller's own tool call.
func (c *Coordinator) requestsOpen(ctx context.Context, _ rpc.Request, r protocol.RequestOpenRequest) (protocol.RequestRecord, error) {
	if r.CallID == "" || len(r.CallID) > requestCallIDBytesMax {
		return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeInvalidArgument, "callId is required (at most %d bytes)", requestCallIDBytesMax)
	}
	schema, err := checkRequestOpen(r)
	if err != nil {
		return protocol.RequestRecord{}, err
	}
	if err := c.authorizeSelf(ctx, r.Self); err != nil {
		return protocol.RequestRecord{}, err
	}
	h, err := c.headers.get(ctx, c.st, r.Self.SessionID)
	if err != nil {
		return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeUnavailable, "read the header of session %s: %w", r.Self.SessionID, err)
	}
	if r.BudgetOf != "" && !slices.Contains(h.Budgets, r.BudgetOf) {
		// A raise of budgetOf answers the request (resumeBudgetPauses): a
		// ledger the session does not draw on would let another tree's
		// raise answer it and learn its id.
		return protocol.RequestRecord{}, protocol.NewError(protocol.CodeInvalidArgument, map[string]any{"field": "budgetOf",
			"reason": fmt.Sprintf("session %s draws on no budget of %s: budgetOf names one of the ledgers its header lists", r.Self.SessionID, r.BudgetOf)})
	}
	now := store.NowMs()
	rec := protocol.RequestRecord{
		Version: protocol.RequestVersion, ID: protocol.RequestID(r.Self.SessionID, r.CallID), SessionID: r.Self.SessionID,
		Kind: r.Kind, CallID: r.CallID, Turn: r.Turn, Step: r.Step, Tool: r.Tool, Arguments: r.Arguments,
		Question: r.Question, Choices: r.Choices, AnswerSchema: schema, BudgetOf: r.BudgetOf, Exhausted: r.Exhausted,
		State: protocol.RequestPending, CreatedAt: now, Deadline: now + h.RequestTimeout(c.cfg.RequestTimeout).Milliseconds(),
		Handler: c.requestHandler(ctx, r.Self.SessionID, nil),
	}
	rev, err := c.st.CreateRequest(ctx, rec)
	if err != nil {
		if !errors.Is(err, store.ErrConflict) {
			return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeUnavailable, "write the request: %w", err)
		}
		// Opened before (a retry, or the call's turn resumed): that one.
		old, err := c.st.Request(ctx, rec.ID)
		if err != nil {
			return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeUnavailable, "read the request %s: %w", rec.ID, err)
		}
		if old.Value.SessionID != rec.SessionID || old.Value.CallID != rec.CallID {
			return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeInternal, "request id %s names another call", rec.ID)
		}
		if r.BudgetRaises != nil && old.Value.State == protocol.RequestPending {
			old.Value, old.Revision = c.answerRaisedMeanwhile(ctx, old.Value, old.Revision, *r.BudgetRaises)
		}
		now, err := c.expired(ctx, old)
		if err == nil {
			c.noticeRequest(ctx, now) // told once: the notice's key is the request's
		}
		return now, err
	}
	c.log.Info("request opened", "request", rec.ID, "session", rec.SessionID, "kind", rec.Kind, "tool", rec.Tool)
	if r.BudgetRaises != nil {
		if rec, _ = c.answerRaisedMeanwhile(ctx, rec, rev, *r.BudgetRaises); rec.State != protocol.RequestPending {
			return rec, nil // nothing to tell: it waits on no one
		}
	}
	c.noticeRequest(ctx, rec)
	return rec, nil
}

// checkRequestOpen checks the fields of r's kind, and that it has none of
// the other kind's; it returns a question's answerSchema as canonical JSON
// text.
func checkRequestOpen(r protocol.RequestOpenRequest) (string, error) {
	if r.Kind != protocol.RequestBudget && (r.BudgetOf != "" || r.Exhausted != "" || r.BudgetRaises != nil) {
		return "", protocol.Errorf(protocol.CodeInvalidArgument, "budgetOf, exhausted and budgetRaises belong to a request of kind %q, not %q", protocol.RequestBudget, r.Kind)
	}
	switch r.Kind {
	case protocol.RequestBudget:
		switch {
		case r.BudgetRaises != nil && (r.BudgetOf == "" || *r.BudgetRaises < 0):
			return "", protocol.Errorf(protocol.CodeInvalidArgument, "budgetRaises goes with budgetOf, a count from 0")
		case r.Tool != "" || r.Arguments != "" || r.Question != "" || len(r.Choices) > 0 || r.AnswerSchema != "":
			return "", protocol.Errorf(protocol.CodeInvalidArgument, "a request of kind %q names no tool, arguments or question", protocol.RequestBudget)
		case r.BudgetOf != "" && !protocol.ValidID(r.BudgetOf):
			return "", protocol.Errorf(protocol.CodeInvalidArgument, "budgetOf %q must match ^[A-Za-z0-9_-]{1,64}$", r.BudgetOf)
		case len(r.Exhausted) > protocol.RequestReasonBytesMax || !utf8.ValidString(r.Exhausted):
			return "", protocol.Errorf(protocol.CodeInvalidArgument, "exhausted must be UTF-8 text of at most %d bytes", protocol.RequestReasonBytesMax)
		}
		return "", nil
	case protocol.RequestApproval:
		switch {
		case r.Tool == "" || len(r.Tool) > requestToolBytesMax:
			return "", protocol.Errorf(protocol.CodeInvalidArgument, "tool is required (at most %d bytes)", requestToolBytesMax)
		case len(r.Arguments) > requestArgumentsBytesMax || !utf8.ValidString(r.Arguments):
			return "", protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
				"limit": "request arguments bytes", "reason": fmt.Sprintf("the arguments are %d bytes (UTF-8 text only); the limit is %d", len(r.Arguments), requestArgumentsBytesMax)})
		case r.Question != "" || len(r.Choices) > 0 || r.AnswerSchema != "":
			return "", protocol.Errorf(protocol.CodeInvalidArgument, "question, choices and answerSchema belong to a request of kind %q, not %q", protocol.RequestQuestion, protocol.RequestApproval)
		}
		return "", nil
	case protocol.RequestQuestion:
		if r.Tool != "" || r.Arguments != "" {
			return "", protocol.Errorf(protocol.CodeInvalidArgument, "tool and arguments belong to a request of kind %q, not %q", protocol.RequestApproval, protocol.RequestQuestion)
		}
		return protocol.CheckQuestion(r.Question, r.Choices, r.AnswerSchema)
	default:
		return "", protocol.Errorf(protocol.CodeInvalidArgument, "request kind %q is not known; the kinds are %q, %q and %q", r.Kind, protocol.RequestApproval, protocol.RequestQuestion, protocol.RequestBudget)
	}
}

// requestsGet reads a request for the child itself or one who may answer it.
func (c *Coordinator) requestsGet(ctx context.Context, _ rpc.Request, r protocol.RequestGetRequest) (protocol.RequestRecord, error) {
	rec, err := c.request(ctx, r.RequestID)
	if err != nil {
		return protocol.RequestRecord{}, err
	}
	if r.Self != nil {
		if err := c.authorizeSelf(ctx, *r.Self); err != nil {
			return protocol.RequestRecord{}, err
		}
		if r.Self.SessionID != rec.Value.SessionID {
			return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeUnauthorized, "request %s is not of session %s", r.RequestID, r.Self.SessionID)
		}
	} else {
		if _, err := c.answerer(ctx, r.Authority, rec.Value.SessionID); err != nil {
			return protocol.RequestRecord{}, err
		}
		// One who may answer learns whether the asking turn still waits
		// (requestended.go); the asking session itself, parked, is that turn.
		rec, err := c.settledRecord(ctx, rec)
		return rec.Value, err
	}
	return c.expired(ctx, rec)
}

// requestsAnswer answers a pending request, once: an approval with approve
// or deny, a question with answer and an answer its choices or
// answerSchema accept. A wrong verb or an answer the question refuses is
// INVALID_ARGUMENT and leaves the request pending.
func (c *Coordinator) requestsAnswer(ctx context.Context, _ rpc.Request, r protocol.RequestAnswerRequest) (protocol.RequestRecord, error) {
	if r.Answer == protocol.AnswerPassUp {
		return c.requestsPassUp(ctx, r)
	}
	state := map[string]string{protocol.AnswerApprove: protocol.RequestApproved, protocol.AnswerDeny: protocol.RequestDenied,
		protocol.AnswerAnswer: protocol.RequestAnswered}[r.Answer]
	switch {
	case state == "":
		return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeInvalidArgument, "answer %q is not known; answer %q or %q (an approval), or %q (a question), or (an agent) %q",
			r.Answer, protocol.AnswerApprove, protocol.AnswerDeny, protocol.AnswerAnswer, protocol.AnswerPassUp)
	case len(r.Reason) > protocol.RequestReasonBytesMax || !utf8.ValidString(r.Reason):
		return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeInvalidArgument, "reason must be UTF-8 text of at most %d bytes", protocol.RequestReasonBytesMax)
	case r.Reason != "" && state != protocol.RequestDenied:
		return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeInvalidArgument, "a reason goes with a denial only")
	case (r.Text != "" || r.JSON != "") && state != protocol.RequestAnswered:
		return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeInvalidArgument, "text and json go with the answer %q (a question's) only", protocol.AnswerAnswer)
	}
	rec, err := c.request(ctx, r.RequestID)
	if err != nil {
		return protocol.RequestRecord{}, err
	}
	by, err := c.answerer(ctx, r.Authority, rec.Value.SessionID)
	if err != nil {
		return protocol.RequestRecord{}, err
	}
	if rec, err = c.settledRecord(ctx, rec); err != nil {
		return protocol.RequestRecord{}, err
	}
	if rec.Value.State != protocol.RequestPending {
		return protocol.RequestRecord{}, alreadyAnswered(rec.Value)
	}
	var text, jsonText string
	switch rec.Value.Kind {
	case protocol.RequestQuestion:
		if state != protocol.RequestAnswered {
			return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeInvalidArgument, "request %s is a question: answer it with %q and text or json; %q and %q answer an approval",
				r.RequestID, protocol.AnswerAnswer, protocol.AnswerApprove, protocol.AnswerDeny)
		}
		if text, jsonText, err = protocol.CheckAnswer(rec.Value, r.Text, r.JSON); err != nil {
			return protocol.RequestRecord{}, err
		}
	default:
		if state == protocol.RequestAnswered {
			return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeInvalidArgument, "request %s asks for approval: %q or %q it; %q answers a question",
				r.RequestID, protocol.AnswerApprove, protocol.AnswerDeny, protocol.AnswerAnswer)
		}
	}
	answered := rec.Value
	answered.State = state
	answered.Answer = &protocol.RequestAnswer{State: state, Reason: r.Reason, Text: text, JSON: jsonText, By: by, At: store.NowMs(), ID: ulid.Make().String()}
	if _, err := c.st.AnswerRequest(ctx, answered, rec.Revision); err != nil {
		if !errors.Is(err, store.ErrConflict) {
			return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeUnavailable, "write the answer: %w", err)
		}
		now, rerr := c.st.Request(ctx, r.RequestID)
		if rerr != nil {
			return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeUnavailable, "read the request %s: %w", r.RequestID, rerr)
		}
		return protocol.RequestRecord{}, alreadyAnswered(now.Value)
	}
	c.log.Info("request answered", "request", answered.ID, "session", answered.SessionID, "state", state, "by", by.Kind)
	c.wakeParked(ctx, answered.SessionID)
	return answered, nil
}

// requestsList lists the requests the caller may answer.
func (c *Coordinator) requestsList(ctx context.Context, _ rpc.Request, r protocol.RequestsListRequest) (protocol.RequestsListReply, error) {
	if r.Under != "" && !protocol.ValidID(r.Under) {
		return protocol.RequestsListReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "under %q must match ^[A-Za-z0-9_-]{1,64}$", r.Under)
	}
	rd, err := c.readerOf(ctx, r.Authority)
	if err != nil {
		return protocol.RequestsListReply{}, err
	}
	// Pending ones come from the pending index (as many as turns are
	// parked), not from every record of the last day.
	list := c.st.PendingRequestIDs
	if r.All {
		list = c.st.RequestIDs
	}
	ids, more, err := list(ctx, protocol.RequestsListMax)
	if err != nil {
		return protocol.RequestsListReply{}, protocol.Errorf(protocol.CodeUnavailable, "%w", err)
	}
	out := protocol.RequestsListReply{Requests: []protocol.RequestRecord{}, More: more}
	for _, id := range ids {
		rec, err := c.st.Request(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			c.unlistStale(ctx, r.All, id)
			continue
		}
		if err != nil {
			return protocol.RequestsListReply{}, protocol.Errorf(protocol.CodeUnavailable, "read the request %s: %w", id, err)
		}
		if rec, err = c.expiredRecord(ctx, rec); err != nil {
			return protocol.RequestsListReply{}, err
		}
		v := rec.Value
		if !r.All && v.State != protocol.RequestPending {
			c.unlistStale(ctx, r.All, id)
			continue
		}
		if v.SessionID == rd.agent {
			continue
		}
		if ok, err := c.covers(ctx, rd, v.SessionID); err != nil || !ok {
			continue
		}
		if r.Under != "" && v.SessionID != r.Under {
			if ok, err := c.covers(ctx, reader{agent: r.Under}, v.SessionID); err != nil || !ok {
				continue
			}
		}
		// Only the caller's own are read for an ended turn (a log read each).
		if rec, err = c.endedRecord(ctx, rec); err != nil {
			return protocol.RequestsListReply{}, err
		}
		if v = rec.Value; !r.All && v.State != protocol.RequestPending {
			continue
		}
		out.Requests = append(out.Requests, v)
	}
	slices.SortFunc(out.Requests, func(a, b protocol.RequestRecord) int {
		return cmp.Or(cmp.Compare(a.CreatedAt, b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	return out, nil
}

// unlistStale removes request id from the pending index when a listing of
// it (not of all) found its record gone or no longer pending: a crash
// between the record's write and the index's left it behind. Best effort:
// the next listing tries again.
func (c *Coordinator) unlistStale(ctx context.Context, all bool, id string) {
	if all {
		return
	}
	if err := c.st.UnlistRequest(ctx, id); err != nil {
		c.log.Warn("could not unlist a stale pending request", "requestId", id, "err", err)
	}
}

// request reads request id from the bucket's leader.
func (c *Coordinator) request(ctx context.Context, id string) (store.Record[protocol.RequestRecord], error) {
	if id == "" || len(id) > 64 || !protocol.ValidID(id) {
		return store.Record[protocol.RequestRecord]{}, protocol.Errorf(protocol.CodeInvalidArgument, "request id %q must match ^[A-Za-z0-9_-]{1,64}$", id)
	}
	rec, err := c.st.Request(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return rec, protocol.NewError(protocol.CodeNotFound, map[string]any{"what": "request " + id})
	}
	if err != nil {
		return rec, protocol.Errorf(protocol.CodeUnavailable, "read the request %s: %w", id, err)
	}
	return rec, nil
}

// answerer checks that auth may answer a request of session child: a user
// grant whose scope holds the child's tree, or the live credential of one
// of the child's ancestors (authorizeRead's subtree rule), never the child
// itself. A sibling or a stranger is UNAUTHORIZED, whether or not the
// session exists.
func (c *Coordinator) answerer(ctx context.Context, auth protocol.Authority, child string) (protocol.Answerer, error) {
	rd, err := c.authorizeRead(ctx, auth, child)
	if err != nil {
		return protocol.Answerer{}, err
	}
	switch {
	case rd.agent == child:
		return protocol.Answerer{}, protocol.Errorf(protocol.CodeUnauthorized, "a session never answers its own request; its user or an ancestor does")
	case rd.agent != "":
		return protocol.Answerer{Kind: protocol.AnswererAgent, SessionID: rd.agent}, nil
	default:
		return protocol.Answerer{Kind: protocol.AnswererUser, User: rd.grant.user}, nil
	}
}

// expired is expiredRecord's value.
func (c *Coordinator) expired(ctx context.Context, rec store.Record[protocol.RequestRecord]) (protocol.RequestRecord, error) {
	r, err := c.expiredRecord(ctx, rec)
	return r.Value, err
}

// expiredRecord moves a pending request past its deadline to timed-out, by
// compare-and-set (an answer that landed first stands), and returns the
// record as it is now.
func (c *Coordinator) expiredRecord(ctx context.Context, rec store.Record[protocol.RequestRecord]) (store.Record[protocol.RequestRecord], error) {
	if rec.Value.State != protocol.RequestPending || store.NowMs() < rec.Value.Deadline {
		return rec, nil
	}
	out := rec.Value
	out.State = protocol.RequestTimedOut
	out.Answer = &protocol.RequestAnswer{State: protocol.RequestTimedOut, By: protocol.Answerer{Kind: protocol.AnswererTimeout}, At: store.NowMs(),
		Reason: fmt.Sprintf("no answer within %s", time.Duration(out.Deadline-out.CreatedAt)*time.Millisecond), ID: ulid.Make().String()}
	rev, err := c.st.AnswerRequest(ctx, out, rec.Revision)
	if errors.Is(err, store.ErrConflict) {
		now, err := c.st.Request(ctx, rec.Value.ID)
		if err != nil {
			return rec, protocol.Errorf(protocol.CodeUnavailable, "read the request %s: %w", rec.Value.ID, err)
		}
		return now, nil
	}
	if err != nil {
		return rec, protocol.Errorf(protocol.CodeUnavailable, "write the timeout of request %s: %w", rec.Value.ID, err)
	}
	c.log.Info("request timed out", "request", out.ID, "session", out.SessionID)
	c.wakeParked(ctx, out.SessionID) // its turn goes on with the timeout, as with an answer
	return store.Record[protocol.RequestRecord]{Value: out, Revision: rev}, nil
}

// alreadyAnswered is the answer to a second answer.
func alreadyAnswered(rec protocol.RequestRecord) error {
	by := ""
	if rec.Answer != nil {
		by = rec.Answer.By.Kind
	}
	return protocol.NewError(protocol.CodeAlreadyAnswered, map[string]any{"requestId": rec.ID, "state": rec.State, "by": by})
}
