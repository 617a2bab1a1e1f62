package client

import (
	"context"

	"github.com/brood-dev/brood/pkg/protocol"
)

// OpenRequest opens the request for approval of the calling agent's own
// tool call (requests.open, docs/protocol.md §5.21; req.Self is its
// session id and live credential) and returns the record, pending; opening
// the same call's request again returns the one already open. Errors:
// UNAUTHORIZED, INVALID_ARGUMENT, LIMIT_EXCEEDED (arguments), UNAVAILABLE.
func (c *Client) OpenRequest(ctx context.Context, req protocol.RequestOpenRequest) (protocol.RequestRecord, error) {
	var r protocol.RequestRecord
	err := c.Call(ctx, protocol.EpRequestsOpen, req, &r)
	return r, err
}

// GetRequest reads a request (requests.get) as its own session (req.Self)
// or as one who may answer it (req.Authority: a user grant over its tree,
// or an ancestor's live credential). A pending request past its deadline
// is answered timed-out by this read. Errors: NOT_FOUND, UNAUTHORIZED,
// UNAVAILABLE.
func (c *Client) GetRequest(ctx context.Context, req protocol.RequestGetRequest) (protocol.RequestRecord, error) {
	var r protocol.RequestRecord
	err := c.Call(ctx, protocol.EpRequestsGet, req, &r)
	return r, err
}

// AnswerRequest approves or denies a pending request (requests.answer) as
// the user (a grant over the asking session's tree) or one of its
// ancestors (a live credential); the asking session itself, a sibling or a
// stranger is UNAUTHORIZED. The first answer wins: a request answered (or
// timed out) before is ALREADY_ANSWERED, naming its state. It returns the
// answered record.
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
