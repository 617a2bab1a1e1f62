package client

import (
	"context"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Continuable children (docs/design.md §7; docs/protocol.md §5.8–§5.14). Every
// call returns a *protocol.Error on failure.

// StartContinuable starts a continuable child (continuable.start); it
// returns once the child's inbox accepted the prompt, or, with the parent
// at its live-children limit, once the start waits in the parent's start
// queue: the reply's State is protocol.StateQueued, and its ChildID and
// MessageID are the ids the child and its prompt will have once it starts
// (State says queued until then; a Followup meanwhile is UNAVAILABLE;
// docs/protocol.md §5.5, "The start queue").
func (c *Client) StartContinuable(ctx context.Context, req protocol.ContinuableStartRequest) (protocol.ContinuableStartReply, error) {
	var r protocol.ContinuableStartReply
	err := c.Call(ctx, protocol.EpContinuableStart, req, &r)
	return r, err
}

// Followup sends a message that becomes one of the child's next turns
// (continuable.followup). Held in the reply says why an accepted message
// waits (a drain holds the child's admission closed).
func (c *Client) Followup(ctx context.Context, req protocol.FollowupRequest) (protocol.FollowupReply, error) {
	var r protocol.FollowupReply
	err := c.Call(ctx, protocol.EpContinuableFollowup, req, &r)
	return r, err
}

// State reports a child's residency (continuable.state): running (a turn
// runs or work waits), waiting (idle, owning live children), settled
// (teardown in progress) or none (no live activation), and how many
// accepted messages wait in its inbox.
func (c *Client) State(ctx context.Context, req protocol.ChildRef) (protocol.StateReply, error) {
	var r protocol.StateReply
	err := c.Call(ctx, protocol.EpContinuableState, req, &r)
	return r, err
}

// Interrupt stops a child's current turn and parks its queue until the next
// send (continuable.interrupt). The reply says whether a live activation got
// it (an absent one is an accepted no-op).
func (c *Client) Interrupt(ctx context.Context, req protocol.InterruptRequest) (protocol.InterruptReply, error) {
	var r protocol.InterruptReply
	err := c.Call(ctx, protocol.EpContinuableInterrupt, req, &r)
	return r, err
}

// Report sends a resident child's report to its live parent
// (continuable.report).
func (c *Client) Report(ctx context.Context, req protocol.ReportRequest) (protocol.FollowupReply, error) {
	var r protocol.FollowupReply
	err := c.Call(ctx, protocol.EpContinuableReport, req, &r)
	return r, err
}

// Drain disposes activations child-first, or lifts a drain
// (continuable.drain; see protocol.DrainRequest for the scopes).
func (c *Client) Drain(ctx context.Context, req protocol.DrainRequest) (protocol.DrainReply, error) {
	var r protocol.DrainReply
	err := c.Call(ctx, protocol.EpContinuableDrain, req, &r)
	return r, err
}

// DisposeDescendants disposes the live continuable descendants of the
// calling agent req.Agent (its own session id and credential), deepest
// first, and answers once they all stopped (descendants.dispose,
// docs/protocol.md §5.13b): what a one-shot run's host sends when the run's
// turn is over. Errors: UNAUTHORIZED (no lease, another credential),
// UNAVAILABLE, ACTIVATION_TEARDOWN_FAILED (some did not stop; named).
func (c *Client) DisposeDescendants(ctx context.Context, req protocol.DescendantsDisposeRequest) (protocol.DrainReply, error) {
	var r protocol.DrainReply
	err := c.Call(ctx, protocol.EpDescendantsDispose, req, &r)
	return r, err
}

// Drains lists the drain markers and what each holds closed
// (continuable.drains, user grant).
func (c *Client) Drains(ctx context.Context, req protocol.DrainsListRequest) (protocol.DrainsListReply, error) {
	var r protocol.DrainsListReply
	err := c.Call(ctx, protocol.EpContinuableDrains, req, &r)
	return r, err
}

// Children lists a parent's children or descendants (children.list); without
// a parent and with a user grant, the live continuable activations.
func (c *Client) Children(ctx context.Context, req protocol.ChildrenListRequest) (protocol.ChildrenListReply, error) {
	var r protocol.ChildrenListReply
	err := c.Call(ctx, protocol.EpChildrenList, req, &r)
	return r, err
}
