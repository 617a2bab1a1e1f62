// Package client is the Go client of the Brood coordinator API (docs/design.md
// §7, docs/protocol.md §5): roots, one-shot runs and their results,
// continuable children, session headers and logs, lifecycle events (past and
// followed live) and a root's inbox (settlement notices and reports).
//
// It speaks only to the coordinator: every call is a NATS request to
// `<prefix>.v1.user.<user>.<endpoint>` for the connection's NATS user
// (`<prefix>.v1.coord.<endpoint>` without one; Options.User), and
// everything that comes back (replies, run notices, followed events) arrives
// on subjects under the connection's own inbox prefix
// (nats.CustomInboxPrefix; _INBOX.<user> in a deployment with users). So a
// client needs no JetStream permission and no subscription outside its inbox
// prefix (docs/security.md). A call NATS refuses the connection's user ends
// at once with PERMISSION_DENIED.
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
// subject lies under it, so results arrive without a per-run consumer; a run
// takes only a notice naming its own run id, and one that missed its notice
// falls back to runs.await.
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
	// OutageMax bounds how long a wait that outlives single requests
	// (Run.Result, Follow.Next, Retrying) goes on while every attempt is
	// UNAVAILABLE (DefaultOutageMax, 1 minute); then it answers UNAVAILABLE.
	// The connection must be able to reconnect (nats.MaxReconnects(-1)) to
	// ride out a broker restart; a closed one ends the wait at once.
	OutageMax time.Duration
	// User is the NATS user the client acts as: it calls the coordinator on
	// that user's own subjects, <prefix>.v1.user.<User>.<endpoint>
	// (protocol.Subjects.User), where a deployment knows who calls (notify
	// subjects under _INBOX.<User>, user-scoped grants, per-user quotas;
	// docs/security.md). Default: the connection's user (nats.UserInfo);
	// none (as in `brood dev`) calls the anonymous <prefix>.v1.coord.<endpoint>.
	User string
}

// Client talks to the coordinators of one deployment. It is safe for
// concurrent use.
type Client struct {
	nc    *nats.Conn
	subj  protocol.Subjects
	opts  Options
	perms *permWatch

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
	if opts.OutageMax <= 0 {
		opts.OutageMax = DefaultOutageMax
	}
	if opts.User == "" {
		opts.User = nc.Opts.User
	}
	if opts.User != "" && !protocol.ValidID(opts.User) {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "user %q must match ^[A-Za-z0-9_-]{1,64}$ (it names the subjects the client calls)", opts.User)
	}
	return &Client{nc: nc, subj: subj, opts: opts, perms: newPermWatch(nc), waiters: map[string]chan protocol.RunNotice{}}, nil
}

// User returns the NATS user the client calls as ("" for none).
func (c *Client) User() string { return c.opts.User }

// Conn returns the client's NATS connection.
func (c *Client) Conn() *nats.Conn { return c.nc }

// Subjects returns the deployment's subject names.
func (c *Client) Subjects() protocol.Subjects { return c.subj }

// Close removes the notify subscription. It does not close the connection.
func (c *Client) Close() {
	c.perms.close()
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
//
// The request goes to the endpoint's subject for the client's user
// (Options.User). A request NATS refuses this connection's user ends at
// once with PERMISSION_DENIED naming the subject (perms.go).
func (c *Client) Call(ctx context.Context, endpoint string, req, reply any) error {
	return c.callSubject(ctx, c.subj.Call(c.opts.User, endpoint), req, reply)
}

func (c *Client) callSubject(ctx context.Context, subject string, req, reply any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.Timeout)
		defer cancel()
	}
	ctx, done := c.perms.watch(ctx, subject)
	defer done()
	giveUp := time.Now().Add(NoRespondersRetryMax)
	for {
		err := Call(ctx, c.nc, subject, req, reply)
		if denied := deniedCause(ctx); denied != nil {
			return denied
		}
		if !errors.Is(err, nats.ErrNoResponders) || time.Now().Add(noRespondersWait).After(giveUp) {
			return err
		}
		t := time.NewTimer(noRespondersWait)
		select {
		case <-ctx.Done():
			t.Stop()
			if denied := deniedCause(ctx); denied != nil {
				return denied
			}
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

// UserGrant mints a user grant (authority.user) on the client's own
// subject: with a user, a grant that acts only on the trees of the roots
// that user opened (reply.User); without one, a grant over every session.
// UNAUTHORIZED when the deployment mints none.
func (c *Client) UserGrant(ctx context.Context) (protocol.UserGrantReply, error) {
	var r protocol.UserGrantReply
	err := c.Call(ctx, protocol.EpAuthorityUser, protocol.Empty{}, &r)
	return r, err
}

// GlobalGrant mints a user grant over every session: authority.user on the
// anonymous subject, which a deployment lets only trusted hosts publish
// (others get PERMISSION_DENIED at once; docs/security.md).
func (c *Client) GlobalGrant(ctx context.Context) (protocol.UserGrantReply, error) {
	var r protocol.UserGrantReply
	err := c.callSubject(ctx, c.subj.Coord(protocol.EpAuthorityUser), protocol.Empty{}, &r)
	return r, err
}

// ownInbox returns a new subject under the connection's inbox prefix, for a
// stream that only this client may receive.
func (c *Client) ownInbox(kind string) string {
	return c.nc.NewInbox() + "." + strings.TrimSpace(kind)
}
