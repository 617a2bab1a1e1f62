package client

import (
	"context"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Reads through the coordinator (docs/protocol.md §5.16–§5.19). Authority:
// a user grant reads everything; a live agent's credential reads its own
// subtree (itself and every session below it).

// LogEventsMax bounds the events Log reads (1,000,000): a longer log is read
// page by page with LogPage.
const LogEventsMax = 1_000_000

// Header reads a session's immutable header (sessions.get).
func (c *Client) Header(ctx context.Context, req protocol.SessionGetRequest) (protocol.SessionHeader, error) {
	var h protocol.SessionHeader
	err := c.Call(ctx, protocol.EpSessionsGet, req, &h)
	return h, err
}

// LogPage reads one page of a session's events (sessions.log). With
// req.WaitMs, a read that finds no event at req.FromSeq waits up to that long
// for one (a live tail).
func (c *Client) LogPage(ctx context.Context, req protocol.LogReadRequest) (protocol.LogPage, error) {
	var p protocol.LogPage
	err := c.callWaiting(ctx, protocol.EpSessionsLog, req.WaitMs, req, &p)
	return p, err
}

// SessionLog is a session's header and its events from some seq on.
type SessionLog struct {
	Header protocol.SessionHeader
	Events []protocol.SessionEvent
}

// Log reads a session's header and every event from req.FromSeq to the end
// of its log as it is now, page by page (req.WaitMs is ignored). A log longer
// than LogEventsMax is LIMIT_EXCEEDED.
func (c *Client) Log(ctx context.Context, req protocol.LogReadRequest) (SessionLog, error) {
	var out SessionLog
	h, err := c.Header(ctx, protocol.SessionGetRequest{SessionID: req.SessionID, Authority: req.Authority})
	if err != nil {
		return out, err
	}
	out.Header, out.Events = h, []protocol.SessionEvent{}
	req.WaitMs = 0
	for {
		p, err := c.LogPage(ctx, req)
		if err != nil {
			return out, err
		}
		out.Events = append(out.Events, p.Events...)
		if p.Complete {
			return out, nil
		}
		if len(out.Events) > LogEventsMax {
			return out, protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
				"limit": "log events", "reason": "the log is longer than the client reads at once; read it page by page with LogPage"})
		}
		req.FromSeq, req.Cursor = p.NextSeq, p.Cursor
	}
}

// Events reads one page of past lifecycle events (events.read).
func (c *Client) Events(ctx context.Context, req protocol.EventsReadRequest) (protocol.EventsPage, error) {
	var p protocol.EventsPage
	err := c.Call(ctx, protocol.EpEventsRead, req, &p)
	return p, err
}
