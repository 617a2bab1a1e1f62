package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Reads through the coordinator (docs/design.md §14): session headers and logs,
// past lifecycle events, a root's inbox (events.follow is in follow.go).
// Each checks authority (authority.go), so a client needs no JetStream permission at all:
// a user grant reads everything; a live agent's credential reads its own
// subtree (itself and every session whose ancestry holds it); a root's inbox
// is read and acknowledged with that root's own credential. A session
// outside the caller's subtree answers UNAUTHORIZED whether or not it
// exists, so a credential learns nothing about other users' sessions.

// headerFor reads a session's header for a reader already authorized on it.
func (c *Coordinator) headerFor(ctx context.Context, id string) (protocol.SessionHeader, error) {
	h, err := c.headers.get(ctx, c.st, id)
	if errors.Is(err, store.ErrNotFound) {
		return h, protocol.NewError(protocol.CodeNotFound, map[string]any{"what": "session " + id})
	}
	if err != nil {
		return h, protocol.Errorf(protocol.CodeUnavailable, "read the header of %s: %w", id, err)
	}
	return h, nil
}

func (c *Coordinator) sessionsGet(ctx context.Context, req rpc.Request, r protocol.SessionGetRequest) (protocol.SessionHeader, error) {
	if _, err := c.authorizeRead(ctx, r.Authority, r.SessionID); err != nil {
		return protocol.SessionHeader{}, err
	}
	return c.headerFor(ctx, r.SessionID)
}

// clamp returns v, or def when v is not positive, capped at max.
func clamp(v, def, max int) int {
	if v <= 0 {
		return def
	}
	return min(v, max)
}

func (c *Coordinator) sessionsLog(ctx context.Context, req rpc.Request, r protocol.LogReadRequest) (protocol.LogPage, error) {
	if _, err := c.authorizeRead(ctx, r.Authority, r.SessionID); err != nil {
		return protocol.LogPage{}, err
	}
	if r.FromSeq < 0 {
		return protocol.LogPage{}, protocol.Errorf(protocol.CodeInvalidArgument, "fromSeq must not be negative")
	}
	h, err := c.headerFor(ctx, r.SessionID)
	if err != nil {
		return protocol.LogPage{}, err
	}
	eventsMax := clamp(r.EventsMax, protocol.LogPageEventsDefault, protocol.LogPageEventsMax)
	var page protocol.LogPage
	err = c.longPoll(ctx, req, c.subj.Log(h.Scope(), r.SessionID), r.WaitMs, func() (bool, error) {
		var err error
		page, err = c.st.ReadLogPage(ctx, h.Scope(), r.SessionID, r.FromSeq, r.Cursor, eventsMax, protocol.ReadPageBytesMax)
		return len(page.Events) > 0, err
	})
	if err != nil {
		return protocol.LogPage{}, pollError(err)
	}
	return page, nil
}

// longPollRecheck are the pauses between re-reads after a wake-up: the core
// message that wakes a poll can arrive before JetStream stored it.
var longPollRecheck = []time.Duration{0, 10 * time.Millisecond, 50 * time.Millisecond, 200 * time.Millisecond}

// pollError is the answer to a long poll that failed: its own
// LIMIT_EXCEEDED (fairshare.go) as is, any other failure UNAVAILABLE.
func pollError(err error) error {
	if protocol.CodeOf(err) == protocol.CodeLimitExceeded {
		return err
	}
	return protocol.Errorf(protocol.CodeUnavailable, "%w", err)
}

// longPoll calls read until it finds something or waitMs (capped at
// protocol.ReadWaitMsMax) passed, waking on core messages on subject (every
// JetStream publish to a stream subject is also a core message on it).
// Before it waits it takes one of the replica's long-poll slots for the
// caller (LIMIT_EXCEEDED when the caller or the replica holds its maximum)
// and gives its request slot back (rpc.Park): a waiting long poll takes
// nothing from the requests that do work (fairshare.go).
func (c *Coordinator) longPoll(ctx context.Context, req rpc.Request, subject string, waitMs int64, read func() (bool, error)) error {
	found, err := read()
	if err != nil || found || waitMs <= 0 {
		return err
	}
	user := c.callerOf(req)
	if err := c.longPolls.Take(user); err != nil {
		return err
	}
	defer c.longPolls.Give(user)
	rpc.Park(ctx)
	wctx, cancel := context.WithTimeout(ctx, time.Duration(min(waitMs, protocol.ReadWaitMsMax))*time.Millisecond)
	defer cancel()
	sub, err := c.cfg.NC.SubscribeSync(subject)
	if err != nil {
		return fmt.Errorf("subscribe to %s: %w", subject, err)
	}
	defer sub.Unsubscribe()
	for {
		// Read again first: something may have arrived before the subscription.
		for _, pause := range longPollRecheck {
			if pause > 0 {
				select {
				case <-time.After(pause):
				case <-wctx.Done():
					return nil
				}
			}
			if found, err = read(); err != nil || found {
				return err
			}
		}
		if _, err := sub.NextMsgWithContext(wctx); err != nil {
			return nil // the wait is over; the last read stands
		}
	}
}

func (s *eventScope) read(ctx context.Context, st *store.Store, after protocol.Seq, eventsMax int) (protocol.EventsPage, error) {
	return st.ReadEventsPage(ctx, s.subject, after, eventsMax, protocol.EventsScanMsgsMax, func(ev protocol.LifecycleEvent) (bool, error) {
		return s.keep(ctx, ev.ParentSession)
	})
}

func (c *Coordinator) eventsRead(ctx context.Context, req rpc.Request, r protocol.EventsReadRequest) (protocol.EventsPage, error) {
	scope, err := c.eventScope(ctx, r.Parent, r.Descendants, r.Authority)
	if err != nil {
		return protocol.EventsPage{}, err
	}
	page, err := scope.read(ctx, c.st, r.AfterSeq, clamp(r.EventsMax, protocol.EventsPageDefault, protocol.EventsPageMax))
	if err != nil {
		if protocol.CodeOf(err) != "" {
			return protocol.EventsPage{}, err
		}
		return protocol.EventsPage{}, protocol.Errorf(protocol.CodeUnavailable, "%w", err)
	}
	return page, nil
}

func (c *Coordinator) inboxRead(ctx context.Context, req rpc.Request, r protocol.InboxReadRequest) (protocol.InboxPage, error) {
	scope, err := c.authorizeInbox(ctx, r.Authority, r.SessionID, false)
	if err != nil {
		return protocol.InboxPage{}, err
	}
	itemsMax := clamp(r.ItemsMax, protocol.InboxPageItemsDefault, protocol.InboxPageItemsMax)
	page := protocol.InboxPage{Items: []protocol.InboxItem{}}
	err = c.longPoll(ctx, req, c.subj.Inbox(scope, r.SessionID), r.WaitMs, func() (bool, error) {
		var err error
		page.Items, page.More, err = c.st.ReadInboxPage(ctx, scope, r.SessionID, r.AfterSeq, itemsMax, protocol.ReadPageBytesMax)
		return len(page.Items) > 0, err
	})
	if err != nil {
		return protocol.InboxPage{}, pollError(err)
	}
	return page, nil
}

func (c *Coordinator) inboxAck(ctx context.Context, req rpc.Request, r protocol.InboxAckRequest) (protocol.InboxAckReply, error) {
	if len(r.Seqs) == 0 || len(r.Seqs) > protocol.InboxAckSeqsMax {
		return protocol.InboxAckReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "seqs must name 1 to %d inbox sequences", protocol.InboxAckSeqsMax)
	}
	scope, err := c.authorizeInbox(ctx, r.Authority, r.SessionID, true)
	if err != nil {
		return protocol.InboxAckReply{}, err
	}
	n, err := c.st.RemoveInboxItems(ctx, scope, r.SessionID, r.Seqs)
	if err != nil {
		if protocol.CodeOf(err) != "" {
			return protocol.InboxAckReply{}, err
		}
		return protocol.InboxAckReply{}, protocol.Errorf(protocol.CodeUnavailable, "%w", err)
	}
	return protocol.InboxAckReply{Removed: n}, nil
}
