// Package client is the Go client of the Brood coordinator API (DESIGN.md
// §7, docs/protocol.md §5): roots, one-shot runs and their results,
// continuable children, session headers and logs, lifecycle events (past and
// followed live) and a root's inbox (settlement notices and reports).
//
// It speaks only to the coordinator: every call is a NATS request to
// `<prefix>.v1.coord.<endpoint>`, and everything that comes back (replies,
// run notices, followed events) arrives on subjects under the connection's
// own inbox prefix (nats.CustomInboxPrefix sets it). So a client needs no
// JetStream permission and no subscription outside its inbox prefix.
//
// Every method takes a context and, when the endpoint takes input, the
// request struct of pkg/protocol; it returns the reply struct. Every error
// is a *protocol.Error with a catalogue code (errors.Is(err,
// protocol.ErrUnauthorized)); an error the client made itself (a timeout, a
// cancelled context, a lost connection) also wraps its cause
// (errors.Is(err, context.DeadlineExceeded)). A child that ends without
// completing is a result with another stop reason, not an error.
//
// A Client owns one wildcard subscription for run notices: each run's notify
// subject lies under it, so results arrive without a per-run consumer, and a
// run that missed its notice falls back to runs.await.
package client

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Options configure a Client. Zero values take the defaults.
type Options struct {
	// Prefix is the deployment's subject prefix; default "brood".
	Prefix string
	// Timeout bounds each request whose context has no deadline
	// (DefaultTimeout, 30 s): longer than a coordinator's whole budget for a
	// request (20 s), so the client hears the coordinator's own answer. Each
	// request tells the coordinator how long it waits (header Brood-Timeout).
	Timeout time.Duration
	// AwaitFallback is how long Run.Result waits for its notice before it
	// asks runs.await instead (10 s).
	AwaitFallback time.Duration
}

// Client talks to the coordinators of one deployment. It is safe for
// concurrent use.
type Client struct {
	nc   *nats.Conn
	subj protocol.Subjects
	opts Options

	mu           sync.Mutex
	notifySub    *nats.Subscription
	notifyPrefix string
	waiters      map[string]chan protocol.RunNotice
}

// New returns a client on nc. It fails only for an invalid prefix.
func New(nc *nats.Conn, opts Options) (*Client, error) {
	subj, err := protocol.NewSubjects(opts.Prefix)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "%v", err).WithCause(err)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.AwaitFallback <= 0 {
		opts.AwaitFallback = 10 * time.Second
	}
	return &Client{nc: nc, subj: subj, opts: opts, waiters: map[string]chan protocol.RunNotice{}}, nil
}

// Conn returns the client's NATS connection.
func (c *Client) Conn() *nats.Conn { return c.nc }

// Subjects returns the deployment's subject names.
func (c *Client) Subjects() protocol.Subjects { return c.subj }

// Close removes the notify subscription. It does not close the connection.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.notifySub != nil {
		_ = c.notifySub.Unsubscribe()
		c.notifySub = nil
	}
}

// Call sends a request to a coordinator endpoint (protocol.Ep*) and decodes
// the reply into reply (nil to ignore it). ctx without a deadline gets
// Options.Timeout. Errors are *protocol.Error (see Call at package level). No
// responders (no coordinator is subscribed just now: they are reconnecting
// after their NATS server went away, or none runs) means the request reached
// nobody, so Call asks again, every noRespondersWait for up to
// NoRespondersRetryMax (within ctx's deadline), for every endpoint; then it
// answers UNAVAILABLE.
func (c *Client) Call(ctx context.Context, endpoint string, req, reply any) error {
	return c.callSubject(ctx, c.subj.Coord(endpoint), req, reply)
}

func (c *Client) callSubject(ctx context.Context, subject string, req, reply any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.Timeout)
		defer cancel()
	}
	giveUp := time.Now().Add(NoRespondersRetryMax)
	for {
		err := Call(ctx, c.nc, subject, req, reply)
		if !errors.Is(err, nats.ErrNoResponders) || time.Now().Add(noRespondersWait).After(giveUp) {
			return err
		}
		t := time.NewTimer(noRespondersWait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// NoRespondersRetryMax bounds how long Call keeps asking when no coordinator
// is subscribed: long enough for coordinators to reconnect to another NATS
// server, short enough that a deployment without one answers promptly.
const NoRespondersRetryMax = 3 * time.Second

// noRespondersWait is the pause before a request that reached no coordinator
// is sent again.
const noRespondersWait = 200 * time.Millisecond

// callWaiting is Call for a request that may wait on the coordinator for
// up to waitMs (a long poll): its deadline covers the wait plus Options.Timeout.
func (c *Client) callWaiting(ctx context.Context, endpoint string, waitMs int64, req, reply any) error {
	if waitMs > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(min(waitMs, protocol.ReadWaitMsMax))*time.Millisecond+c.opts.Timeout)
		defer cancel()
	}
	return c.Call(ctx, endpoint, req, reply)
}

// Providers lists the live providers (providers.list).
func (c *Client) Providers(ctx context.Context) (protocol.ProvidersListReply, error) {
	var r protocol.ProvidersListReply
	err := c.Call(ctx, protocol.EpProvidersList, protocol.Empty{}, &r)
	return r, err
}

// UserGrant mints a user grant (authority.user). Only hosts whose NATS user
// may publish that subject can; others get UNAVAILABLE (no permission means
// no responder) or UNAUTHORIZED (grants disabled).
func (c *Client) UserGrant(ctx context.Context) (protocol.UserGrantReply, error) {
	var r protocol.UserGrantReply
	err := c.Call(ctx, protocol.EpAuthorityUser, protocol.Empty{}, &r)
	return r, err
}

// ownInbox returns a new subject under the connection's inbox prefix, for a
// stream that only this client may receive.
func (c *Client) ownInbox(kind string) string {
	return c.nc.NewInbox() + "." + strings.TrimSpace(kind)
}
