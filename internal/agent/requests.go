package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/brood-dev/brood/internal/requestwait"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Requester opens and reads a session's requests (docs/protocol.md §5.21);
// *client.Client is the production one, acting with the agent's own
// credential.
type Requester = requestwait.Requester

// Why a parked call got no answer (park's failure).
const (
	parkOpened   = iota + 1 // the request could not be opened (err says why)
	parkLogged              // its request/open could not be logged
	parkEnded               // the turn ended while the call was parked
	parkAnswered            // its request/answer could not be logged
)

// park parks the tool call of req (its CallID) until its request is
// answered (docs/protocol.md §5.21): it opens the request, logs
// request/open, polls the request until it leaves pending, and logs
// request/answer. parked, when set, is the call's request/open logged
// before its host died (ContinueParked): nothing is opened or logged
// again, and the call waits for that request. On success failed is 0 and
// rec is the answered (or timed-out) record, d what was logged of its
// answer; otherwise failed says which step failed, err why. While parked
// the call holds its turn's goroutine, the session's lease and nothing of
// the model: no model request is open between steps.
func (a *Agent) park(ctx context.Context, turn int64, req protocol.RequestOpenRequest, parked *protocol.RequestOpenData) (rec protocol.RequestRecord, d protocol.RequestAnswerData, failed int, err error) {
	req.Self = protocol.ParentRef{SessionID: a.cfg.Header.ID, Credential: a.cfg.Credential}
	if parked != nil {
		rec = protocol.RequestRecord{ID: parked.RequestID, SessionID: req.Self.SessionID, CallID: req.CallID, Kind: parked.Kind, State: protocol.RequestPending}
		a.log.Info("tool call parked again on its request after a restart", "request", rec.ID, "kind", rec.Kind, "tool", req.Tool, "call", req.CallID)
		a.notePaused(*parked)
		return a.awaitAnswer(ctx, turn, req.Self, req.CallID, rec, 0)
	}
	rec, err = requestwait.Open(ctx, a.cfg.Requests, req)
	if err != nil {
		return rec, d, parkOpened, err
	}
	var b eventBuf
	open := protocol.RequestOpenData{
		RequestID: rec.ID, Kind: rec.Kind, Turn: req.Turn, Step: req.Step, CallID: req.CallID, Tool: req.Tool, Deadline: rec.Deadline,
	}
	b.add(a, protocol.EvRequestOpen, open)
	if b.err != nil {
		return rec, d, parkLogged, b.err
	}
	if _, ok := a.append(ctx, turn, b.evs); !ok {
		return rec, d, parkLogged, errors.New("the log refused it")
	}
	a.log.Info("tool call parked on a request", "request", rec.ID, "kind", rec.Kind, "tool", req.Tool, "call", req.CallID)
	a.notePaused(open)
	return a.awaitAnswer(ctx, turn, req.Self, req.CallID, rec, requestwait.PollInterval)
}

// awaitAnswer polls request rec (its first read after first) until it
// leaves pending and logs its request/answer (park).
func (a *Agent) awaitAnswer(ctx context.Context, turn int64, self protocol.ParentRef, callID string, rec protocol.RequestRecord, first time.Duration) (protocol.RequestRecord, protocol.RequestAnswerData, int, error) {
	var d protocol.RequestAnswerData
	rec, err := a.pollRequest(ctx, self, rec, first)
	if err != nil {
		return rec, d, parkEnded, err
	}
	var ab eventBuf
	d = requestwait.AnswerData(rec, callID)
	ab.add(a, protocol.EvRequestAnswer, d)
	if ab.err != nil {
		return rec, d, parkAnswered, ab.err
	}
	if _, ok := a.append(ctx, turn, ab.evs); !ok {
		return rec, d, parkAnswered, errors.New("the log refused it")
	}
	return rec, d, 0, nil
}

// awaitApproval parks the tool call c until its request for approval is
// answered (park; parked as there), and reports whether the call may run;
// when it may not, res is the call's result (the denial, the timeout, or
// why no one could be asked).
func (a *Agent) awaitApproval(ctx context.Context, turn, step int64, c protocol.ToolCall, parked *protocol.RequestOpenData) (res ToolResult, approved bool) {
	rec, d, failed, err := a.park(ctx, turn, protocol.RequestOpenRequest{
		Kind: protocol.RequestApproval, CallID: c.ID, Turn: turn, Step: step, Tool: c.Name, Arguments: c.Arguments,
	}, parked)
	switch failed {
	case parkOpened:
		return ErrorResult("%s needs approval, and the request for it could not be opened (%v); it did not run", c.Name, err), false
	case parkLogged:
		return ErrorResult("%s needs approval, and its request could not be logged (%v); it did not run", c.Name, err), false
	case parkEnded:
		if protocol.CodeOf(err) == protocol.CodeNotFound {
			return ErrorResult("%s was waiting for approval (request %s), and the request is gone; it did not run", c.Name, rec.ID), false
		}
		return ErrorResult("%s was waiting for approval (request %s) when the turn ended; it did not run", c.Name, rec.ID), false
	case parkAnswered:
		return ErrorResult("%s: the answer to its request could not be logged (%v); it did not run", c.Name, err), false
	}
	return approvalResult(c.Name, rec.ID, d)
}

// approvalResult is what the logged answer d of request id of a call to
// tool says: it may run (approved), or its result (the denial, the
// timeout).
func approvalResult(tool, id string, d protocol.RequestAnswerData) (ToolResult, bool) {
	switch d.State {
	case protocol.RequestApproved:
		return ToolResult{}, true
	case protocol.RequestTimedOut:
		return ErrorResult("%s got no answer to its request for approval (%s) in time; the request timed out, which counts as a denial; it did not run", tool, id), false
	case protocol.RequestCancelled:
		return ErrorResult("%s: its request for approval (%s) was cancelled (%s); it did not run", tool, id, d.Reason), false
	default:
		reason := ""
		if d.Reason != "" {
			reason = ": " + d.Reason
		}
		return ErrorResult("%s was denied by %s%s; it did not run", tool, requestwait.AnswererName(d.By), reason), false
	}
}

// AskToolName is the name of the ask tool.
const AskToolName = "ask"

// AskTool is the ask tool of spawn and fork children (issue 33): the
// agent asks a question of whoever may answer for it (the user, or an
// ancestor) and its call waits for the answer, which becomes the call's
// result. The agent runs it (Agent.ask, through Config.Requests), never
// Run; it needs no approval itself, and the tool filters apply to it as to
// every global tool.
func AskTool() *Tool {
	return &Tool{
		Name: AskToolName,
		Description: "Ask the user (or the agent that delegated this work) a question and wait for the answer, which is this call's result. " +
			"Use it when you cannot go on without a decision or a fact only they have. " +
			fmt.Sprintf("Offer choices (at most %d) when the answer is one of a few, or an answerSchema (a JSON Schema) when you need the answer as JSON; not both. ", protocol.RequestChoicesMax) +
			"The question times out if no one answers in time; then decide without it.",
		Parameters: json.RawMessage(`{"type":"object","properties":{` +
			`"question":{"type":"string","description":"the question, in full: the reader sees nothing else of your work"},` +
			`"choices":{"type":"array","items":{"type":"string"},"description":"the possible answers; the answer is exactly one of them"},` +
			`"answerSchema":{"type":"object","description":"a JSON Schema (type, properties, required, additionalProperties, items, enum, const, oneOf) the answer must match; the answer is then JSON text"}},` +
			`"required":["question"],"additionalProperties":false}`),
		Asks: true,
		Run: func(context.Context, ToolContext, string) ToolResult {
			return ErrorResult("ask: this session cannot ask anyone anything")
		},
	}
}

// ask runs a call to the ask tool: it opens a question request (park;
// parked as there) and returns the answer, text or JSON text, as the
// call's result; an error result when the question could not be asked, the
// turn ended while it waited, or no answer came in time.
func (a *Agent) ask(ctx context.Context, turn, step int64, c protocol.ToolCall, parked *protocol.RequestOpenData) ToolResult {
	var in struct {
		Question     string          `json:"question"`
		Choices      []string        `json:"choices"`
		AnswerSchema json.RawMessage `json:"answerSchema"`
	}
	if err := decodeArgs(c.Arguments, &in); err != nil {
		return ErrorResult("ask: %v", err)
	}
	schema := ""
	if s := strings.TrimSpace(string(in.AnswerSchema)); s != "" && s != "null" {
		schema = s
	}
	if _, err := protocol.CheckQuestion(in.Question, in.Choices, schema); err != nil {
		return ErrorResult("ask: %v; nothing was asked", err)
	}
	if a.cfg.Requests == nil {
		return ErrorResult("ask: this session cannot ask anyone anything; decide without an answer, or say in your answer what you need")
	}
	rec, d, failed, err := a.park(ctx, turn, protocol.RequestOpenRequest{
		Kind: protocol.RequestQuestion, CallID: c.ID, Turn: turn, Step: step, Question: in.Question, Choices: in.Choices, AnswerSchema: schema,
	}, parked)
	switch failed {
	case parkOpened:
		return ErrorResult("ask: the question could not be asked (%v)", err)
	case parkLogged:
		return ErrorResult("ask: the question could not be logged (%v); it was not asked", err)
	case parkEnded:
		if protocol.CodeOf(err) == protocol.CodeNotFound {
			return ErrorResult("ask: the question (request %s) is gone; decide without its answer", rec.ID)
		}
		return ErrorResult("ask: the turn ended while the question (request %s) waited for its answer", rec.ID)
	case parkAnswered:
		return ErrorResult("ask: the answer to the question (request %s) could not be logged (%v)", rec.ID, err)
	}
	return askResult(rec.ID, d)
}

// askResult is an ask call's result from the logged answer d of its
// question, request id.
func askResult(id string, d protocol.RequestAnswerData) ToolResult {
	switch {
	case d.State == protocol.RequestAnswered && d.JSON != "":
		return TextResult(d.JSON)
	case d.State == protocol.RequestAnswered:
		return TextResult(d.Text)
	case d.State == protocol.RequestTimedOut:
		return ErrorResult("ask: no answer came to the question (request %s) in time; it timed out, so decide without it", id)
	default:
		return ErrorResult("ask: the question (request %s) ended %s with no answer", id, d.State)
	}
}

// pollRequest reads the request, first after first, until it is no longer
// pending, or ctx ends (its error), as every asking session does
// (requestwait.Await).
func (a *Agent) pollRequest(ctx context.Context, self protocol.ParentRef, rec protocol.RequestRecord, first time.Duration) (protocol.RequestRecord, error) {
	return requestwait.Await(ctx, a.cfg.Requests, self, rec, first, a.log)
}
