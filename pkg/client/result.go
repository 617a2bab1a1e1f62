package client

import (
	"context"

	"github.com/brood-dev/brood/pkg/protocol"
)

// SessionResult asks sessions.result for a child's last finished turn: what
// it answered there and how the turn ended (protocol.SessionResultReply).
func (c *Client) SessionResult(ctx context.Context, req protocol.SessionResultRequest) (protocol.SessionResultReply, error) {
	var r protocol.SessionResultReply
	err := c.Call(ctx, protocol.EpSessionsResult, req, &r)
	return r, err
}
