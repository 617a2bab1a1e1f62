package coordinator

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"
	"unicode"

	"github.com/oklog/ulid/v2"

	"github.com/brood-dev/brood/internal/gopool"
	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// RootHostID is the host id recorded in a root's lease: roots live in their
// client, which renews them, and do not heartbeat.
const RootHostID = "client"

// DefaultRootLease is how long a root agent lives without agents.renew
// unless Config.RootLease says otherwise.
const DefaultRootLease = 30 * time.Second

// renewAttemptsMax bounds the compare-and-set attempts of one agents.renew
// or agents.close that races with another write of the root's lease.
const renewAttemptsMax = 3

// CwdBytesMax bounds a root's workspace path.
const CwdBytesMax = 4096

// markHeaderWait bounds the header read of a drain marker's session when
// its header is not cached.
const markHeaderWait = 2 * time.Second

func (c *Coordinator) agentsOpen(ctx context.Context, req rpc.Request, r protocol.AgentsOpenRequest) (protocol.AgentsOpenReply, error) {
	if r.SessionID != "" {
		return c.agentsReopen(ctx, r)
	}
	if r.Cwd == "" || !filepath.IsAbs(r.Cwd) || len(r.Cwd) > CwdBytesMax || strings.ContainsFunc(r.Cwd, unicode.IsControl) {
		return protocol.AgentsOpenReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "cwd must be an absolute path of at most %d bytes", CwdBytesMax)
	}
	if err := protocol.CheckRequestTimeout(r.RequestTimeoutMs); err != nil {
		return protocol.AgentsOpenReply{}, err
	}
	if r.Budget != nil {
		if err := r.Budget.Validate(); err != nil {
			return protocol.AgentsOpenReply{}, err
		}
	}
	user := c.callerOf(req)
	id := ulid.Make().String()
	if err := c.reserveRoot(ctx, user, id); err != nil {
		return protocol.AgentsOpenReply{}, err
	}
	now := store.NowMs()
	cred := protocol.NewCredential()
	// The root records who opened it: a grant of that user acts on its tree.
	h := protocol.SessionHeader{Version: protocol.SessionHeaderVersion, ID: id, CreatedAt: now, Cwd: filepath.Clean(r.Cwd), User: user,
		RequestTimeoutMs: r.RequestTimeoutMs}
	if err := c.narrowRoot(ctx, &h, r); err != nil {
		c.releaseRootSlot(ctx, user, id)
		return protocol.AgentsOpenReply{}, err
	}
	if r.Budget != nil {
		// The root's budget caps its whole tree: its ledger exists before
		// its header names it.
		if err := c.createBudget(ctx, id, *r.Budget, now); err != nil {
			c.releaseRootSlot(ctx, user, id)
			return protocol.AgentsOpenReply{}, err
		}
		h.Budgets, h.BudgetDeadlineAt = childBudgets(h, r.Budget, id, now)
	}
	lease := protocol.AgentRecord{
		SessionID: id, Kind: protocol.AgentRoot, HostID: RootHostID, Epoch: 1,
		CredentialHash: protocol.HashCredential(cred), ExpiresAt: now + c.cfg.RootLease.Milliseconds(), CreatedAt: now,
		User: user, HeaderDigest: protocol.HeaderDigest(h),
	}
	var rev uint64
	if err := parallel(ctx,
		func() error { return c.st.PutHeader(ctx, h) },
		func() (err error) { rev, err = c.st.CreateLease(ctx, lease); return err },
	); err != nil {
		// The root's lease may have landed unanswered: its slot lapses
		// after its grace unless the lease is live.
		return protocol.AgentsOpenReply{}, protocol.Errorf(protocol.CodeUnavailable, "open root: %w", err)
	}
	// The user's next open on this replica counts this root.
	c.agents.observe(lease, rev)
	c.headers.add(h)
	return protocol.AgentsOpenReply{SessionID: id, Credential: cred, LeaseMs: c.cfg.RootLease.Milliseconds(), ExpiresAt: lease.ExpiresAt}, nil
}

func (c *Coordinator) agentsRenew(ctx context.Context, req rpc.Request, p protocol.ParentRef) (protocol.AgentsRenewReply, error) {
	for attempt := 0; attempt < renewAttemptsMax; attempt++ {
		l, err := c.authorize(ctx, p)
		if err != nil {
			return protocol.AgentsRenewReply{}, err
		}
		if l.rec.Kind != protocol.AgentRoot {
			return protocol.AgentsRenewReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "session %s is not a root; only roots are renewed", p.SessionID)
		}
		rec := l.rec
		rec.ExpiresAt = store.NowMs() + c.cfg.RootLease.Milliseconds()
		rev, err := c.st.UpdateLease(ctx, rec, l.rev)
		if errors.Is(err, store.ErrConflict) {
			c.agents.del(store.RootLeaseKey(p.SessionID)) // force a fresh read
			continue
		}
		if err != nil {
			return protocol.AgentsRenewReply{}, protocol.Errorf(protocol.CodeUnavailable, "renew: %w", err)
		}
		c.agents.observe(rec, rev)
		return protocol.AgentsRenewReply{ExpiresAt: rec.ExpiresAt}, nil
	}
	return protocol.AgentsRenewReply{}, protocol.Errorf(protocol.CodeUnavailable, "renew of %s kept conflicting; retry", p.SessionID)
}

func (c *Coordinator) agentsClose(ctx context.Context, req rpc.Request, p protocol.ParentRef) (protocol.Empty, error) {
	l, err := c.authorize(ctx, p)
	if err != nil {
		return protocol.Empty{}, err
	}
	if l.rec.Kind != protocol.AgentRoot {
		return protocol.Empty{}, protocol.Errorf(protocol.CodeInvalidArgument, "session %s is not a root; only roots are closed by clients", p.SessionID)
	}
	if err := c.releaseRoot(ctx, p, l.rev); err != nil {
		return protocol.Empty{}, err
	}
	c.agents.del(store.RootLeaseKey(p.SessionID))
	// The root's one-shot runs belong to it: dispose them now rather than at
	// the next monitor tick (docs/design.md §7, Settlement 4).
	go c.disposeOrphans(context.WithoutCancel(ctx), p.SessionID)
	return protocol.Empty{}, nil
}

// releaseRoot deletes the lease of the root p names, first at rev (from
// authorize: possibly this replica's cache). The delete is a compare-and-set,
// and a renewal another replica answered moves the revision on: a conflict
// reads the lease from the leader and deletes it at its revision, while it
// is still p's lease. Before, a conflict counted as closed: the lease lived
// on until it lapsed, and so did the credential (make test's chaos seed 1:
// a run started 6 s after its root's close was accepted, I4). A lease gone,
// or holding another credential (a reopened root), is closed.
func (c *Coordinator) releaseRoot(ctx context.Context, p protocol.ParentRef, rev uint64) error {
	if err := c.markClosed(ctx, p.SessionID); err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "close: %w", err)
	}
	for attempt := 0; attempt < renewAttemptsMax; attempt++ {
		err := c.st.ReleaseLease(ctx, p.SessionID, rev)
		if err == nil {
			return nil
		}
		if !errors.Is(err, store.ErrConflict) {
			return protocol.Errorf(protocol.CodeUnavailable, "close: %w", err)
		}
		fresh, err := c.st.LeaseLatest(ctx, p.SessionID)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return protocol.Errorf(protocol.CodeUnavailable, "close: read the lease of %s: %w", p.SessionID, err)
		}
		if !protocol.CredentialMatches(p.Credential, fresh.Value.CredentialHash) {
			return nil
		}
		rev = fresh.Revision
	}
	return protocol.Errorf(protocol.CodeUnavailable, "close of %s kept conflicting; retry", p.SessionID)
}

// markClosed writes root id's closed marker (store.PutClosedRoot) before
// its lease goes, so the collector finds every root whose lease is gone
// (docs/security.md, "Garbage collection"); a root whose lease stays after
// all (the delete failed, or it was reopened) is never collected while it
// is live, and a later close writes the marker again.
func (c *Coordinator) markClosed(ctx context.Context, id string) error {
	if err := c.st.PutClosedRoot(ctx, id, store.NowMs()); err != nil {
		return fmt.Errorf("mark root %s closed: %w", id, err)
	}
	return nil
}

// parallel runs fns concurrently and returns the first error. The first
// runs on the calling goroutine (a request's handler, whose stack already
// grew), the others on the goroutines of the handler's server when ctx
// carries them (gopool.Go): a fresh goroutine's stack growth was 29 µs of
// the coordinator's CPU per one-shot run (issue 12's profile).
func parallel(ctx context.Context, fns ...func() error) error {
	if len(fns) == 0 {
		return nil
	}
	errs := make(chan error, len(fns))
	for _, f := range fns[1:] {
		gopool.Go(ctx, func() { errs <- f() })
	}
	errs <- fns[0]()
	var first error
	for range fns {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}
