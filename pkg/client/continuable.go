package client

import (
	"context"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Continuable children (DESIGN.md §7). Every call returns *protocol.Error on failure.

// StartContinuable starts a continuable child of parent; it returns once the
// child's inbox accepted the prompt.
func (c *Client) StartContinuable(ctx context.Context, req protocol.ContinuableStartRequest) (protocol.ContinuableStartReply, error) {
	var r protocol.ContinuableStartReply
	err := c.Call(ctx, protocol.EpContinuableStart, req, &r)
	return r, err
}

// Followup sends a message that becomes one of the child's next turns.
func (c *Client) Followup(ctx context.Context, req protocol.FollowupRequest) (string, error) {
	r, err := c.FollowupReply(ctx, req)
	return r.MessageID, err
}

// FollowupReply is Followup with the whole reply (Held says why an accepted
// message waits).
func (c *Client) FollowupReply(ctx context.Context, req protocol.FollowupRequest) (protocol.FollowupReply, error) {
	var r protocol.FollowupReply
	err := c.Call(ctx, protocol.EpContinuableFollowup, req, &r)
	return r, err
}

// State reports a child's residency: running, waiting, or none.
func (c *Client) State(ctx context.Context, childID string, auth protocol.Authority) (protocol.StateReply, error) {
	var r protocol.StateReply
	err := c.Call(ctx, protocol.EpContinuableState, protocol.ChildRef{ChildID: childID, Authority: auth}, &r)
	return r, err
}

// Interrupt stops a child's current turn and parks its queue until the next send.
func (c *Client) Interrupt(ctx context.Context, childID string, auth protocol.Authority) error {
	_, err := c.InterruptReply(ctx, childID, auth)
	return err
}

// InterruptReply is Interrupt with the reply: whether a live activation got it.
func (c *Client) InterruptReply(ctx context.Context, childID string, auth protocol.Authority) (protocol.InterruptReply, error) {
	var r protocol.InterruptReply
	err := c.Call(ctx, protocol.EpContinuableInterrupt, protocol.InterruptRequest{ChildID: childID, Authority: auth}, &r)
	return r, err
}

// Drains lists the drain markers and what each holds closed.
func (c *Client) Drains(ctx context.Context, auth protocol.Authority) (protocol.DrainsListReply, error) {
	var r protocol.DrainsListReply
	err := c.Call(ctx, protocol.EpContinuableDrains, protocol.DrainsListRequest{Authority: auth}, &r)
	return r, err
}

// Report sends a resident child's report to its live parent.
func (c *Client) Report(ctx context.Context, child protocol.ParentRef, content []protocol.ContentBlock) (string, error) {
	var r protocol.FollowupReply
	err := c.Call(ctx, protocol.EpContinuableReport, protocol.ReportRequest{Child: child, Content: content}, &r)
	return r.MessageID, err
}

// Drain disposes activations child-first (see protocol.DrainRequest for the scopes).
func (c *Client) Drain(ctx context.Context, req protocol.DrainRequest) (protocol.DrainReply, error) {
	var r protocol.DrainReply
	err := c.Call(ctx, protocol.EpContinuableDrain, req, &r)
	return r, err
}

// Children lists a parent's children, or its descendants.
func (c *Client) Children(ctx context.Context, req protocol.ChildrenListRequest) ([]protocol.ChildRow, error) {
	var r protocol.ChildrenListReply
	err := c.Call(ctx, protocol.EpChildrenList, req, &r)
	return r.Rows, err
}

// UserGrant mints a user grant (only hosts allowed to call authority.user can).
func (c *Client) UserGrant(ctx context.Context) (protocol.UserGrantReply, error) {
	var r protocol.UserGrantReply
	err := c.Call(ctx, protocol.EpAuthorityUser, protocol.Empty{}, &r)
	return r, err
}
