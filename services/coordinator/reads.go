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

// Reads through the coordinator (DESIGN.md §14): session headers and logs,
// past lifecycle events, a root's inbox (events.follow is in follow.go).
// Each checks authority, so a client needs no JetStream permission at all:
// a user grant reads everything; a live agent's credential reads its own
// subtree (itself and every session whose ancestry holds it); a root's inbox
// is read and acknowledged with that root's own credential. A session
// outside the caller's subtree answers UNAUTHORIZED whether or not it
// exists, so a credential learns nothing about other users' sessions.

// reader is who reads: a user grant (over every session, or over the trees
// of one user's roots), or the live agent of a session.
type reader struct {
	grant grantScope
	agent string
}

// readerOf checks a read's authority: a valid grant, or a live agent's credential.
func (c *Coordinator) readerOf(ctx context.Context, auth protocol.Authority) (reader, error) {
	if auth.Grant != "" {
		g, err := c.grantOf(ctx, auth.Grant)
		if err != nil {
			return reader{}, err
		}
		return reader{grant: g}, nil
	}
	if auth.Parent == nil {
		return reader{}, protocol.Errorf(protocol.CodeUnauthorized, "the credential of a live agent or a user grant is required")
	}
	if _, err := c.authorize(ctx, *auth.Parent); err != nil {
		return reader{}, err
	}
	return reader{agent: auth.Parent.SessionID}, nil
}

// covers reports whether session id lies in the reader's subtree (a
// grant's scope, or the agent and its descendants). An unknown session is
// in nobody's subtree.
func (c *Coordinator) covers(ctx context.Context, r reader, id string) (bool, error) {
	if r.grant.all || (r.agent != "" && id == r.agent) {
		return true, nil
	}
	h, err := c.headers.get(ctx, c.st, id)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, protocol.Errorf(protocol.CodeUnavailable, "read the header of %s: %w", id, err)
	}
	if r.agent == "" {
		return r.grant.covers(ctx, c, h)
	}
	up, err := c.lineage(ctx, h)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, protocol.Errorf(protocol.CodeUnavailable, "read the lineage of %s: %w", id, err)
	}
	return contains(up, r.agent), nil
}

// authorizeRead checks that auth may read session id.
func (c *Coordinator) authorizeRead(ctx context.Context, auth protocol.Authority, id string) (reader, error) {
	if !protocol.ValidID(id) {
		return reader{}, protocol.Errorf(protocol.CodeInvalidArgument, "session id %q must match ^[A-Za-z0-9_-]{1,64}$", id)
	}
	r, err := c.readerOf(ctx, auth)
	if err != nil {
		return r, err
	}
	ok, err := c.covers(ctx, r, id)
	if err != nil {
		return r, err
	}
	if !ok {
		if r.agent == "" {
			return r, notCovered(r.grant, id)
		}
		return r, protocol.Errorf(protocol.CodeUnauthorized, "session %s is not in the subtree of %s (or does not exist); an agent reads only itself and its descendants", id, r.agent)
	}
	return r, nil
}

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
	err = c.longPoll(ctx, c.subj.Log(h.Scope(), r.SessionID), r.WaitMs, func() (bool, error) {
		var err error
		page, err = c.st.ReadLogPage(ctx, h.Scope(), r.SessionID, r.FromSeq, r.Cursor, eventsMax, protocol.ReadPageBytesMax)
		return len(page.Events) > 0, err
	})
	if err != nil {
		return protocol.LogPage{}, protocol.Errorf(protocol.CodeUnavailable, "%w", err)
	}
	return page, nil
}

// longPollRecheck are the pauses between re-reads after a wake-up: the core
// message that wakes a poll can arrive before JetStream stored it.
var longPollRecheck = []time.Duration{0, 10 * time.Millisecond, 50 * time.Millisecond, 200 * time.Millisecond}

// longPoll calls read until it finds something or waitMs (capped at
// protocol.ReadWaitMsMax) passed, waking on core messages on subject (every
// JetStream publish to a stream subject is also a core message on it). A
// long poll holds one of the coordinator's request slots while it waits.
func (c *Coordinator) longPoll(ctx context.Context, subject string, waitMs int64, read func() (bool, error)) error {
	found, err := read()
	if err != nil || found || waitMs <= 0 {
		return err
	}
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

// eventScope is which lifecycle events a read or follow returns: the
// subject filter it scans and a test on each event's parent.
type eventScope struct {
	subject string
	rdr     reader
	auth    protocol.Authority
	keep    func(ctx context.Context, parent string) (bool, error)
}

// subtreeMemoMax bounds the parents a descendants scope remembers.
const subtreeMemoMax = 100_000

// eventScope checks authority and builds the scope of an events.read or
// events.follow request.
func (c *Coordinator) eventScope(ctx context.Context, parent string, descendants bool, auth protocol.Authority) (*eventScope, error) {
	all := func(context.Context, string) (bool, error) { return true, nil }
	if parent == "" {
		if descendants {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "descendants needs a parent")
		}
		if auth.Grant == "" {
			return nil, protocol.Errorf(protocol.CodeUnauthorized, "reading every parent's events needs a user grant; an agent reads its own subtree (give parent)")
		}
		g, err := c.grantOf(ctx, auth.Grant)
		if err != nil {
			return nil, err
		}
		rdr := reader{grant: g}
		if g.all {
			return &eventScope{subject: c.subj.EventsAll("*"), rdr: rdr, auth: auth, keep: all}, nil
		}
		// A grant of one user: the events of every parent in that user's trees.
		return &eventScope{subject: c.subj.EventsAll("*"), rdr: rdr, auth: auth, keep: c.memoCovers(rdr, "")}, nil
	}
	rdr, err := c.authorizeRead(ctx, auth, parent)
	if err != nil {
		return nil, err
	}
	if !descendants {
		return &eventScope{subject: c.subj.EventsAll(parent), rdr: rdr, auth: auth, keep: all}, nil
	}
	return &eventScope{subject: c.subj.EventsAll("*"), rdr: rdr, auth: auth, keep: c.memoCovers(reader{agent: parent}, parent)}, nil
}

// memoCovers returns covers(r, ·) remembering its answers (at most
// subtreeMemoMax); known, when set, is covered without a look.
func (c *Coordinator) memoCovers(r reader, known string) func(ctx context.Context, p string) (bool, error) {
	memo := map[string]bool{}
	if known != "" {
		memo[known] = true
	}
	return func(ctx context.Context, p string) (bool, error) {
		if in, ok := memo[p]; ok {
			return in, nil
		}
		in, err := c.covers(ctx, r, p)
		if err != nil {
			return false, err
		}
		if len(memo) >= subtreeMemoMax {
			clear(memo)
			if known != "" {
				memo[known] = true
			}
		}
		memo[p] = in
		return in, nil
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

// authorizeInbox checks who may read (or, with ack, acknowledge) a session's
// inbox: the root's own live credential, or a user grant; only a root's
// inbox is acknowledged, since a child's items are claimed by its activation,
// which logs each claim before it deletes the item.
func (c *Coordinator) authorizeInbox(ctx context.Context, auth protocol.Authority, id string, ack bool) error {
	if !protocol.ValidID(id) {
		return protocol.Errorf(protocol.CodeInvalidArgument, "session id %q must match ^[A-Za-z0-9_-]{1,64}$", id)
	}
	if auth.Grant != "" {
		g, err := c.grantOf(ctx, auth.Grant)
		if err != nil {
			return err
		}
		h, err := c.headers.get(ctx, c.st, id)
		switch {
		case errors.Is(err, store.ErrNotFound) && !g.all:
			return notCovered(g, id)
		case err != nil:
			if _, err := c.headerFor(ctx, id); err != nil {
				return err
			}
		}
		if ok, err := g.covers(ctx, c, h); err != nil || !ok {
			if err != nil {
				return err
			}
			return notCovered(g, id)
		}
		if ack {
			root, err := c.isRoot(ctx, h)
			if err != nil {
				return err
			}
			if !root {
				return protocol.Errorf(protocol.CodeInvalidArgument, "session %s is not a root: its inbox items are claimed by its own activation, never acknowledged by a client", id)
			}
		}
		return nil
	}
	if auth.Parent == nil {
		return protocol.Errorf(protocol.CodeUnauthorized, "the root's own credential or a user grant is required")
	}
	l, err := c.authorize(ctx, *auth.Parent)
	if err != nil {
		return err
	}
	if auth.Parent.SessionID != id {
		return protocol.Errorf(protocol.CodeUnauthorized, "a root reads only its own inbox, not that of %s", id)
	}
	if l.rec.Kind != protocol.AgentRoot {
		return protocol.Errorf(protocol.CodeUnauthorized, "session %s is not a root: its inbox items are claimed by its own activation", id)
	}
	return nil
}

// isRoot reports whether a session is a root: its live lease says so, or,
// without one, its header has no parent or was opened reopenable.
func (c *Coordinator) isRoot(ctx context.Context, h protocol.SessionHeader) (bool, error) {
	l, err := c.st.Lease(ctx, h.ID)
	switch {
	case err == nil:
		return l.Value.Kind == protocol.AgentRoot, nil
	case !errors.Is(err, store.ErrNotFound):
		return false, protocol.Errorf(protocol.CodeUnavailable, "read the lease of %s: %w", h.ID, err)
	}
	return h.ParentSession == "" || h.Origin == protocol.OriginReopenable, nil
}

func (c *Coordinator) inboxRead(ctx context.Context, req rpc.Request, r protocol.InboxReadRequest) (protocol.InboxPage, error) {
	if err := c.authorizeInbox(ctx, r.Authority, r.SessionID, false); err != nil {
		return protocol.InboxPage{}, err
	}
	itemsMax := clamp(r.ItemsMax, protocol.InboxPageItemsDefault, protocol.InboxPageItemsMax)
	page := protocol.InboxPage{Items: []protocol.InboxItem{}}
	err := c.longPoll(ctx, c.subj.Inbox(r.SessionID), r.WaitMs, func() (bool, error) {
		var err error
		page.Items, page.More, err = c.st.ReadInboxPage(ctx, r.SessionID, r.AfterSeq, itemsMax, protocol.ReadPageBytesMax)
		return len(page.Items) > 0, err
	})
	if err != nil {
		return protocol.InboxPage{}, protocol.Errorf(protocol.CodeUnavailable, "%w", err)
	}
	return page, nil
}

func (c *Coordinator) inboxAck(ctx context.Context, req rpc.Request, r protocol.InboxAckRequest) (protocol.InboxAckReply, error) {
	if len(r.Seqs) == 0 || len(r.Seqs) > protocol.InboxAckSeqsMax {
		return protocol.InboxAckReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "seqs must name 1 to %d inbox sequences", protocol.InboxAckSeqsMax)
	}
	if err := c.authorizeInbox(ctx, r.Authority, r.SessionID, true); err != nil {
		return protocol.InboxAckReply{}, err
	}
	n, err := c.st.RemoveInboxItems(ctx, r.SessionID, r.Seqs)
	if err != nil {
		if protocol.CodeOf(err) != "" {
			return protocol.InboxAckReply{}, err
		}
		return protocol.InboxAckReply{}, protocol.Errorf(protocol.CodeUnavailable, "%w", err)
	}
	return protocol.InboxAckReply{Removed: n}, nil
}
