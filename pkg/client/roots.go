package client

import (
	"context"
	"sync"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Root is a root agent opened by this client (agents.open). It stays live
// while the client renews it (in the background, every third of its lease)
// and dies with Close or when renewals stop. Its inbox receives the
// settlement notices and reports of its continuable children: read them with
// Inbox and delete them with Ack.
type Root struct {
	c          *Client
	SessionID  string
	Credential string
	// LeaseMs is the root's lease (renewed every LeaseMs/3).
	LeaseMs int64

	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// OpenRoot opens a root agent (agents.open: req.Cwd is its absolute
// workspace; Reopenable, Lineage, and reopening by SessionID with a Grant as
// documented there) and keeps it alive in the background.
func (c *Client) OpenRoot(ctx context.Context, req protocol.AgentsOpenRequest) (*Root, error) {
	var r protocol.AgentsOpenReply
	if err := c.Call(ctx, protocol.EpAgentsOpen, req, &r); err != nil {
		return nil, err
	}
	root := &Root{c: c, SessionID: r.SessionID, Credential: r.Credential, LeaseMs: r.LeaseMs, stop: make(chan struct{}), done: make(chan struct{})}
	every := time.Duration(r.LeaseMs) * time.Millisecond / 3
	if every <= 0 {
		every = 10 * time.Second
	}
	go root.keepAlive(every)
	return root, nil
}

func (r *Root) keepAlive(every time.Duration) {
	defer close(r.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), every)
			_, _ = r.Renew(ctx)
			cancel()
		}
	}
}

// Renew extends the root's lease now (agents.renew); the background renewal
// does this on its own.
func (r *Root) Renew(ctx context.Context) (protocol.AgentsRenewReply, error) {
	var reply protocol.AgentsRenewReply
	err := r.c.Call(ctx, protocol.EpAgentsRenew, r.Ref(), &reply)
	return reply, err
}

// Ref is the root's authority as a parent.
func (r *Root) Ref() protocol.ParentRef {
	return protocol.ParentRef{SessionID: r.SessionID, Credential: r.Credential}
}

// Authority is the root's credential as an Authority (for continuable and
// read requests).
func (r *Root) Authority() protocol.Authority {
	ref := r.Ref()
	return protocol.Authority{Parent: &ref}
}

// Close stops renewing and closes the root (agents.close): its credential
// dies and its one-shot runs are disposed; its continuable children live on.
func (r *Root) Close(ctx context.Context) error {
	r.stopOnce.Do(func() { close(r.stop) })
	<-r.done
	return r.c.Call(ctx, protocol.EpAgentsClose, r.Ref(), nil)
}

// Inbox reads the root's pending inbox items (inbox.read with the root's own
// credential; req.SessionID and req.Authority are filled in when empty).
// With req.WaitMs it waits up to that long for an item to arrive.
func (r *Root) Inbox(ctx context.Context, req protocol.InboxReadRequest) (protocol.InboxPage, error) {
	r.fill(&req.SessionID, &req.Authority)
	return r.c.Inbox(ctx, req)
}

// Ack deletes items the root's client has used from its inbox (inbox.ack;
// req.SessionID and req.Authority are filled in when empty).
func (r *Root) Ack(ctx context.Context, req protocol.InboxAckRequest) (protocol.InboxAckReply, error) {
	r.fill(&req.SessionID, &req.Authority)
	return r.c.Ack(ctx, req)
}

func (r *Root) fill(id *string, auth *protocol.Authority) {
	if *id == "" {
		*id = r.SessionID
	}
	if auth.Parent == nil && auth.Grant == "" {
		*auth = r.Authority()
	}
}

// Notices reads the root's next inbox items (inbox.read: with req.WaitMs it
// waits up to that long for one; req.SessionID and req.Authority are filled
// in when empty), returns them and deletes them (inbox.ack): the way a
// root's client consumes the settlement notices and reports of its
// background children. An item is returned at least once: one whose ack
// failed comes again on the next call.
func (r *Root) Notices(ctx context.Context, req protocol.InboxReadRequest) ([]protocol.InboxItem, error) {
	page, err := r.Inbox(ctx, req)
	if err != nil || len(page.Items) == 0 {
		return page.Items, err
	}
	seqs := make([]protocol.Seq, len(page.Items))
	for i, it := range page.Items {
		seqs[i] = it.Seq
	}
	_, err = r.Ack(ctx, protocol.InboxAckRequest{Seqs: seqs})
	return page.Items, err
}

// Inbox reads a session's pending inbox items (inbox.read): a root's with
// its own credential, any session's with a user grant.
func (c *Client) Inbox(ctx context.Context, req protocol.InboxReadRequest) (protocol.InboxPage, error) {
	var page protocol.InboxPage
	err := c.callWaiting(ctx, protocol.EpInboxRead, req.WaitMs, req, &page)
	return page, err
}

// Ack deletes items from a root's inbox (inbox.ack): with the root's own
// credential, or a user grant. A child's inbox is never acknowledged (its
// activation claims its items): INVALID_ARGUMENT.
func (c *Client) Ack(ctx context.Context, req protocol.InboxAckRequest) (protocol.InboxAckReply, error) {
	var r protocol.InboxAckReply
	err := c.Call(ctx, protocol.EpInboxAck, req, &r)
	return r, err
}
