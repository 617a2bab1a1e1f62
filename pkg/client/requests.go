package client

import (
	"context"

	"github.com/brood-dev/brood/pkg/protocol"
)

// OpenRequest opens the request of the calling agent's own tool call
// (requests.open, docs/protocol.md §5.21; req.Self is its session id and
// live credential): kind approval asks to run the call (req.Tool,
// req.Arguments), kind question asks req.Question, with req.Choices or
// req.AnswerSchema (JSON Schema text) when the answer must be one of them
// or JSON it accepts. It returns the record, pending; opening the same
// call's request again returns the one already open. Errors:
// UNAUTHORIZED, INVALID_ARGUMENT (a field past its bound, an answerSchema
// outside the supported subset), LIMIT_EXCEEDED (arguments), UNAVAILABLE.
func (c *Client) OpenRequest(ctx context.Context, req protocol.RequestOpenRequest) (protocol.RequestRecord, error) {
	var r protocol.RequestRecord
	err := c.Call(ctx, protocol.EpRequestsOpen, req, &r)
	return r, err
}

// GetRequest reads a request (requests.get) as its own session (req.Self)
// or as one who may answer it (req.Authority: a user grant over its tree,
// or an ancestor's live credential). A pending request past its deadline
// is answered timed-out by this read, and (read with req.Authority) one
// whose asking turn ended is cancelled. Errors: NOT_FOUND, UNAUTHORIZED,
// UNAVAILABLE.
func (c *Client) GetRequest(ctx context.Context, req protocol.RequestGetRequest) (protocol.RequestRecord, error) {
	var r protocol.RequestRecord
	err := c.Call(ctx, protocol.EpRequestsGet, req, &r)
	return r, err
}

// AnswerRequest answers a pending request (requests.answer) as the user (a
// grant over the asking session's tree) or one of its ancestors (a live
// credential); the asking session itself, a sibling or a stranger is
// UNAUTHORIZED. An approval takes req.Answer approve or deny (req.Reason);
// a question takes answer with req.Text (one of its choices when it has
// some) or req.JSON (JSON text its answerSchema accepts when it has one):
// the wrong verb, or an answer the question refuses, is INVALID_ARGUMENT
// naming what is wrong, and the request stays pending. The first answer
// wins: a request answered (or timed out) before is ALREADY_ANSWERED,
// naming its state, and so is one whose asking turn ended before an answer
// (its run settled, its turn closed: cancelled), whose call can no longer
// run. It returns the answered record. An ancestor agent
// (req.Authority.Parent) may pass the request up instead, req.Answer
// protocol.AnswerPassUp: it returns the record, still pending, with its new
// Handler (empty: the user) and PassedBy.
func (c *Client) AnswerRequest(ctx context.Context, req protocol.RequestAnswerRequest) (protocol.RequestRecord, error) {
	var r protocol.RequestRecord
	err := c.Call(ctx, protocol.EpRequestsAnswer, req, &r)
	return r, err
}

// Requests lists the requests the authority may answer, oldest first
// (requests.list): pending ones unless req.All, of the subtree of
// req.Under when set, at most protocol.RequestsListMax.
func (c *Client) Requests(ctx context.Context, req protocol.RequestsListRequest) (protocol.RequestsListReply, error) {
	var r protocol.RequestsListReply
	err := c.Call(ctx, protocol.EpRequestsList, req, &r)
	return r, err
}

// AnswerQuestion answers the pending question requestID with text, or
// with jsonText when text is empty (AnswerRequest with the answer verb
// answer).
func (c *Client) AnswerQuestion(ctx context.Context, requestID string, auth protocol.Authority, text, jsonText string) (protocol.RequestRecord, error) {
	return c.AnswerRequest(ctx, protocol.RequestAnswerRequest{RequestID: requestID, Authority: auth, Answer: protocol.AnswerAnswer, Text: text, JSON: jsonText})
}
