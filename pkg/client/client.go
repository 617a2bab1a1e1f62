// Package client is the Go client of the Brood coordinator API (DESIGN.md §7):
// roots, one-shot runs and their results, session logs. The CLI, the
// workers' delegation tools and the tests use it.
//
// A Client owns one wildcard subscription for run results: each run's notify
// subject lies under it, so results arrive without a per-run consumer; a
// run that missed its notification falls back to runs.await.
package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Options configure a Client.
type Options struct {
	// Prefix is the deployment's subject prefix; default "brood".
	Prefix string
	// Timeout bounds each request whose context has no deadline (10 s).
	Timeout time.Duration
	// AwaitFallback is how long a Run waits for its notification before it
	// asks runs.await instead (10 s).
	AwaitFallback time.Duration
}

// Client talks to the coordinators of one deployment.
type Client struct {
	nc   *nats.Conn
	subj protocol.Subjects
	opts Options

	mu           sync.Mutex
	notifySub    *nats.Subscription
	notifyPrefix string
	waiters      map[string]chan protocol.RunNotice
}

// New returns a client on nc.
func New(nc *nats.Conn, opts Options) (*Client, error) {
	subj, err := protocol.NewSubjects(opts.Prefix)
	if err != nil {
		return nil, err
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
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
// the reply. Errors are *protocol.Error.
func (c *Client) Call(ctx context.Context, endpoint string, req, reply any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.Timeout)
		defer cancel()
	}
	return rpc.Call(ctx, c.nc, c.subj.Coord(endpoint), req, reply)
}

// Providers lists the live providers.
func (c *Client) Providers(ctx context.Context) (protocol.ProvidersListReply, error) {
	var r protocol.ProvidersListReply
	err := c.Call(ctx, protocol.EpProvidersList, protocol.Empty{}, &r)
	return r, err
}

// Root is a root agent opened by this client. It stays live while the client
// renews it (KeepAlive) and dies with Close or when renewals stop.
type Root struct {
	c          *Client
	SessionID  string
	Credential string

	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// OpenRoot opens a root agent whose workspace is cwd (absolute) and keeps it
// alive in the background, renewing at a third of its lease.
func (c *Client) OpenRoot(ctx context.Context, cwd string) (*Root, error) {
	return c.OpenRootWith(ctx, protocol.AgentsOpenRequest{Cwd: cwd})
}

// OpenRootWith is OpenRoot with every agents.open option: a reopenable root,
// a lineage that narrows it, or the reopening of a reopenable root by id.
func (c *Client) OpenRootWith(ctx context.Context, req protocol.AgentsOpenRequest) (*Root, error) {
	var r protocol.AgentsOpenReply
	if err := c.Call(ctx, protocol.EpAgentsOpen, req, &r); err != nil {
		return nil, err
	}
	root := &Root{c: c, SessionID: r.SessionID, Credential: r.Credential, stop: make(chan struct{}), done: make(chan struct{})}
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
			_ = r.c.Call(ctx, protocol.EpAgentsRenew, r.Ref(), nil)
			cancel()
		}
	}
}

// Ref is the root's authority as a parent.
func (r *Root) Ref() protocol.ParentRef {
	return protocol.ParentRef{SessionID: r.SessionID, Credential: r.Credential}
}

// Close stops renewing and closes the root; its one-shot runs are disposed.
func (r *Root) Close(ctx context.Context) error {
	r.stopOnce.Do(func() { close(r.stop) })
	<-r.done
	return r.c.Call(ctx, protocol.EpAgentsClose, r.Ref(), nil)
}

// Run is a started one-shot run.
type Run struct {
	c       *Client
	RunID   string
	ChildID string
	parent  protocol.ParentRef
	notice  chan protocol.RunNotice
	token   string
}

func (c *Client) ensureNotify() (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.notifySub != nil {
		return c.notifyPrefix, nil
	}
	prefix := c.nc.NewRespInbox() + ".brood"
	sub, err := c.nc.Subscribe(prefix+".*", c.onNotice)
	if err != nil {
		return "", err
	}
	c.notifySub, c.notifyPrefix = sub, prefix
	return prefix, nil
}

func (c *Client) onNotice(m *nats.Msg) {
	token := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	var n protocol.RunNotice
	if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &n); err != nil {
		return
	}
	c.mu.Lock()
	ch := c.waiters[token]
	delete(c.waiters, token)
	c.mu.Unlock()
	if ch != nil {
		ch <- n
	}
}

// StartRun starts a one-shot child of parent on provider and returns once the
// child is published. Its result arrives with Result.
func (c *Client) StartRun(ctx context.Context, parent protocol.ParentRef, provider string, prompt []protocol.ContentBlock, opts protocol.StartOptions) (*Run, error) {
	prefix, err := c.ensureNotify()
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeUnavailable, "subscribe for results: %v", err)
	}
	token := nuid.Next()
	ch := make(chan protocol.RunNotice, 1)
	c.mu.Lock()
	c.waiters[token] = ch
	c.mu.Unlock()
	var reply protocol.RunStartReply
	err = c.Call(ctx, protocol.EpRunsStart, protocol.RunStartRequest{
		Provider: provider, Parent: parent, Prompt: prompt, Notify: prefix + "." + token, Options: opts,
	}, &reply)
	if err != nil {
		c.mu.Lock()
		delete(c.waiters, token)
		c.mu.Unlock()
		return nil, err
	}
	return &Run{c: c, RunID: reply.RunID, ChildID: reply.ChildID, parent: parent, notice: ch, token: token}, nil
}

// Result waits for the run's result: its notification, or runs.await when
// none came within the fallback interval. A child-level failure is a result
// with a non-completed stop reason, not an error.
func (r *Run) Result(ctx context.Context) (protocol.SubagentResult, error) {
	t := time.NewTimer(r.c.opts.AwaitFallback)
	defer t.Stop()
	defer r.forget()
	for {
		select {
		case n := <-r.notice:
			return n.Result, nil
		case <-ctx.Done():
			return protocol.SubagentResult{}, protocol.Errorf(protocol.CodeCancelled, "waiting for run %s: %v", r.RunID, ctx.Err())
		case <-t.C:
			st, err := r.c.Await(ctx, protocol.RunRef{RunID: r.RunID, Parent: &r.parent, WaitMs: r.c.opts.AwaitFallback.Milliseconds()})
			if err != nil && !errors.Is(err, protocol.ErrUnavailable) {
				return protocol.SubagentResult{}, err
			}
			if err == nil && st.State == protocol.RunSettled && st.Result != nil {
				return *st.Result, nil
			}
			t.Reset(r.c.opts.AwaitFallback)
		}
	}
}

func (r *Run) forget() {
	r.c.mu.Lock()
	delete(r.c.waiters, r.token)
	r.c.mu.Unlock()
}

// Dispose cancels the run (idempotent) and returns its settled status.
func (r *Run) Dispose(ctx context.Context) (protocol.RunStatus, error) {
	return r.c.Dispose(ctx, protocol.RunRef{RunID: r.RunID, Parent: &r.parent})
}

// Await asks runs.await for a run's status, waiting up to ref.WaitMs.
func (c *Client) Await(ctx context.Context, ref protocol.RunRef) (protocol.RunStatus, error) {
	var st protocol.RunStatus
	if ref.WaitMs > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(ref.WaitMs)*time.Millisecond+c.opts.Timeout)
		defer cancel()
	}
	err := c.Call(ctx, protocol.EpRunsAwait, ref, &st)
	return st, err
}

// Dispose asks runs.dispose to cancel a run and returns its settled status.
func (c *Client) Dispose(ctx context.Context, ref protocol.RunRef) (protocol.RunStatus, error) {
	var st protocol.RunStatus
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 40*time.Second)
		defer cancel()
	}
	err := c.Call(ctx, protocol.EpRunsDispose, ref, &st)
	return st, err
}

// Log reads a session's header and every event of its log from JetStream.
func (c *Client) Log(ctx context.Context, sessionID string) (protocol.SessionHeader, []protocol.SessionEvent, error) {
	if !protocol.ValidID(sessionID) {
		return protocol.SessionHeader{}, nil, protocol.Errorf(protocol.CodeInvalidArgument, "session id %q is not a valid id", sessionID)
	}
	st, err := store.Bind(ctx, c.nc, c.subj)
	if err != nil {
		return protocol.SessionHeader{}, nil, protocol.Errorf(protocol.CodeUnavailable, "%v", err)
	}
	h, err := st.GetHeader(ctx, sessionID)
	if errors.Is(err, store.ErrNotFound) {
		return h, nil, protocol.NewError(protocol.CodeNotFound, map[string]any{"what": "session " + sessionID})
	}
	if err != nil {
		return h, nil, protocol.Errorf(protocol.CodeUnavailable, "read header: %v", err)
	}
	log, err := st.ReadLog(ctx, sessionID)
	if err != nil {
		return h, nil, protocol.Errorf(protocol.CodeUnavailable, "read log: %v", err)
	}
	return h, log.Events, nil
}

// ResultError returns nil for a completed result and an error describing any
// other stop reason (for callers that treat non-completion as failure).
func ResultError(res protocol.SubagentResult) error {
	if res.StopReason == protocol.StopCompleted {
		return nil
	}
	msg := "run ended with stopReason " + string(res.StopReason)
	if res.ErrorCode != "" {
		msg += " (" + string(res.ErrorCode) + ")"
	}
	if res.Diagnostic != "" {
		msg += ": " + res.Diagnostic
	}
	return fmt.Errorf("%s", msg)
}
