package coordinator

// Authority (docs/design.md §7, Authority; docs/security.md): who may act on a
// session. A live agent's credential acts on itself and reads its subtree;
// a user grant acts on every session, or on the trees of one user's roots.
// Each check reads the lease, header or grant it decides on; a refusal of
// authority is UNAUTHORIZED and says the same whether or not the session
// exists.

import (
	"context"
	"errors"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// authorize checks that p is the credential of the current live agent of
// p.SessionID (docs/design.md §7, Authority) and returns its lease. A replaced or
// disposed agent's credential is dead. The check uses the watched cache and
// falls back to a direct read, so a lease written (or renewed) a moment ago
// is found even when the watch is behind. Every refusal says the same, so a
// caller without the credential learns nothing about the session (whether
// it exists, has a live agent, or which credential it has).
func (c *Coordinator) authorize(ctx context.Context, p protocol.ParentRef) (leaseState, error) {
	if !protocol.ValidID(p.SessionID) || p.Credential == "" {
		return leaseState{}, protocol.Errorf(protocol.CodeUnauthorized, "a parent sessionId and credential are required")
	}
	l, ok := c.leaseCached(ctx, p.SessionID)
	if !ok || !protocol.CredentialMatches(p.Credential, l.rec.CredentialHash) || !c.leaseLive(l.rec) {
		fresh, err := c.st.Lease(ctx, p.SessionID)
		if err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return leaseState{}, notLiveCredential(p.SessionID)
			}
			return leaseState{}, protocol.Errorf(protocol.CodeUnavailable, "read the lease of %s: %w", p.SessionID, err)
		}
		c.agents.observe(fresh.Value, fresh.Revision)
		l = leaseState{rec: fresh.Value, rev: fresh.Revision}
	}
	if !protocol.CredentialMatches(p.Credential, l.rec.CredentialHash) || !c.leaseLive(l.rec) {
		return leaseState{}, notLiveCredential(p.SessionID)
	}
	return l, nil
}

// leaseCached returns the cached lease of session id, under the key its
// header says: a root's lease only from its root key, which only
// coordinators write, a child's only from its header's provider's key
// (a lease a worker put under its own provider's key for a root or for
// another provider's child is never theirs; docs/security.md). No header,
// no lease.
func (c *Coordinator) leaseCached(ctx context.Context, id string) (leaseState, bool) {
	h, err := c.headers.get(ctx, c.st, id)
	if err != nil {
		return leaseState{}, false
	}
	return c.agents.get(id, h.Scope())
}

// notLiveCredential is every refusal of a credential: no such session, no
// live agent, or another credential.
func notLiveCredential(id string) error {
	return protocol.Errorf(protocol.CodeUnauthorized, "the credential is not that of a live agent of session %s", id)
}

// authorizeFresh is authorize on the lease as stored now, read from the
// bucket's leader, never the cache nor a follower that may not have
// applied a close yet: for the last admission check before something is
// accepted.
func (c *Coordinator) authorizeFresh(ctx context.Context, p protocol.ParentRef) (leaseState, error) {
	if !protocol.ValidID(p.SessionID) || p.Credential == "" {
		return leaseState{}, protocol.Errorf(protocol.CodeUnauthorized, "a parent sessionId and credential are required")
	}
	fresh, err := c.st.LeaseLatest(ctx, p.SessionID)
	if errors.Is(err, store.ErrNotFound) {
		return leaseState{}, notLiveCredential(p.SessionID)
	}
	if err != nil {
		return leaseState{}, protocol.Errorf(protocol.CodeUnavailable, "read the lease of %s: %w", p.SessionID, err)
	}
	c.agents.observe(fresh.Value, fresh.Revision)
	l := leaseState{rec: fresh.Value, rev: fresh.Revision}
	if !protocol.CredentialMatches(p.Credential, l.rec.CredentialHash) || !c.leaseLive(l.rec) {
		return leaseState{}, notLiveCredential(p.SessionID)
	}
	return l, nil
}

// leaseLive reports whether a lease names a live agent: a root before its
// expiry, or an agent on a host that heartbeats. A lease taken over by a
// coordinator, or marked ending (a one-shot run whose turn is over), names no
// live agent.
func (c *Coordinator) leaseLive(rec protocol.AgentRecord) bool {
	if rec.Kind == protocol.AgentRoot {
		return rec.ExpiresAt > store.NowMs()
	}
	if rec.TakenOverBy != "" || rec.Ending {
		return false
	}
	return c.reg.HostLive(rec.HostID)
}

// authorizeSelf checks that p is the credential of the current agent of its
// session, read fresh, live or ending (a one-shot agent ends its descendants
// after its turn, with its lease marked ending); a lease a coordinator took
// over names no agent. The lease is read from the bucket's leader: a
// follower that has not applied a new epoch's lease yet (one just written
// across a partition's heal) would refuse the agent its own credential, and
// a parked tool call that reads its request so would give up its request
// while its turn goes on (found by the chaos checker's I10, issue 33).
func (c *Coordinator) authorizeSelf(ctx context.Context, p protocol.ParentRef) error {
	if !protocol.ValidID(p.SessionID) || p.Credential == "" {
		return protocol.Errorf(protocol.CodeUnauthorized, "a sessionId and its credential are required")
	}
	l, err := c.st.LeaseLatest(ctx, p.SessionID)
	if errors.Is(err, store.ErrNotFound) {
		return protocol.Errorf(protocol.CodeUnauthorized, "session %s has no agent", p.SessionID)
	}
	if err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "read the lease of %s: %w", p.SessionID, err)
	}
	if !protocol.CredentialMatches(p.Credential, l.Value.CredentialHash) || l.Value.TakenOverBy != "" {
		return protocol.Errorf(protocol.CodeUnauthorized, "the credential is not that of the agent of session %s", p.SessionID)
	}
	return nil
}

// authorizeListing: a user grant lists the children of any parent in its
// scope (every session, or its user's trees), an agent (its live
// credential) only its own.
func (c *Coordinator) authorizeListing(ctx context.Context, r protocol.ChildrenListRequest) error {
	switch {
	case r.Authority.Grant != "":
		_, err := c.authorizeRead(ctx, r.Authority, r.Parent)
		return err
	case r.Authority.Parent != nil:
		if _, err := c.authorize(ctx, *r.Authority.Parent); err != nil {
			return err
		}
		if r.Authority.Parent.SessionID != r.Parent {
			return protocol.Errorf(protocol.CodeUnauthorized, "an agent lists only its own children")
		}
		return nil
	default:
		return protocol.Errorf(protocol.CodeUnauthorized, "the parent's credential or a user grant is required")
	}
}

// grantScope is what a valid user grant acts on: every session (all), or
// the trees of the roots one NATS user opened (user; docs/security.md).
type grantScope struct {
	all  bool
	user string
}

// grantOf verifies a user grant minted by authority.user and returns its
// scope. An unknown or expired grant is UNAUTHORIZED.
func (c *Coordinator) grantOf(ctx context.Context, grant string) (grantScope, error) {
	if grant == "" {
		return grantScope{}, protocol.Errorf(protocol.CodeUnauthorized, "no user grant")
	}
	if c.cfg.UserGrantsDisabled {
		// docs/protocol.md §5.15: "grants disabled" refuses every grant,
		// including those minted before (by this deployment or another
		// coordinator with grants on) and not yet expired.
		return grantScope{}, protocol.Errorf(protocol.CodeUnauthorized, "this deployment accepts no user grants")
	}
	rec, err := c.st.Grant(ctx, protocol.HashCredential(grant))
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return grantScope{}, protocol.Errorf(protocol.CodeUnauthorized, "the user grant is unknown")
		}
		return grantScope{}, protocol.Errorf(protocol.CodeUnavailable, "read the user grant: %w", err)
	}
	if rec.Value.ExpiresAt <= store.NowMs() {
		return grantScope{}, protocol.Errorf(protocol.CodeUnauthorized, "the user grant expired")
	}
	return grantScope{all: rec.Value.User == "", user: rec.Value.User}, nil
}

// checkGrant verifies a user grant over every session, for what acts on
// the whole deployment (a global drain and its lift, every live activation,
// every parent's events). A grant scoped to one user is UNAUTHORIZED here.
func (c *Coordinator) checkGrant(ctx context.Context, grant string) error {
	g, err := c.grantOf(ctx, grant)
	if err != nil {
		return err
	}
	if !g.all {
		return protocol.Errorf(protocol.CodeUnauthorized,
			"this needs a grant over every user's sessions (minted on %s, which only trusted hosts may call); the grant of user %s acts only on the trees of the roots %s opened",
			c.subj.Coord(protocol.EpAuthorityUser), g.user, g.user)
	}
	return nil
}

// rootUser returns the user of the root of h's tree (SessionHeader.User).
func (c *Coordinator) rootUser(ctx context.Context, h protocol.SessionHeader) (string, error) {
	if h.ParentSession == "" {
		return h.User, nil
	}
	up, err := c.lineage(ctx, h)
	if err != nil {
		return "", err
	}
	root, err := c.headers.get(ctx, c.st, up[0])
	if err != nil {
		return "", err
	}
	if root.ParentSession != "" {
		return "", nil // the walk stopped at LineageDepthMax: no user's tree
	}
	return root.User, nil
}

// covers reports whether the grant acts on session h.
func (g grantScope) covers(ctx context.Context, c *Coordinator, h protocol.SessionHeader) (bool, error) {
	if g.all {
		return true, nil
	}
	u, err := c.rootUser(ctx, h)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, protocol.Errorf(protocol.CodeUnavailable, "read the lineage of %s: %w", h.ID, err)
	}
	return u != "" && u == g.user, nil
}

// notCovered is the answer to a grant scoped to one user acting on a
// session outside that user's trees, or on one that does not exist: the
// same either way, so a grant learns nothing of other users' sessions.
func notCovered(g grantScope, id string) error {
	return protocol.Errorf(protocol.CodeUnauthorized, "session %s is not in a tree of a root user %s opened (or does not exist); a grant minted by user %s acts only there", id, g.user, g.user)
}

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

// authorizeInbox checks who may read (or, with ack, acknowledge) a session's
// inbox: the root's own live credential, or a user grant; only a root's
// inbox is acknowledged, since a child's items are claimed by its activation,
// which logs each claim before it deletes the item. It returns the
// session's scope (its header's Scope), which names its inbox's stream.
func (c *Coordinator) authorizeInbox(ctx context.Context, auth protocol.Authority, id string, ack bool) (scope string, err error) {
	if !protocol.ValidID(id) {
		return "", protocol.Errorf(protocol.CodeInvalidArgument, "session id %q must match ^[A-Za-z0-9_-]{1,64}$", id)
	}
	if auth.Grant != "" {
		g, err := c.grantOf(ctx, auth.Grant)
		if err != nil {
			return "", err
		}
		h, err := c.headers.get(ctx, c.st, id)
		switch {
		case errors.Is(err, store.ErrNotFound) && !g.all:
			return "", notCovered(g, id)
		case err != nil:
			if h, err = c.headerFor(ctx, id); err != nil {
				return "", err
			}
		}
		if ok, err := g.covers(ctx, c, h); err != nil || !ok {
			if err != nil {
				return "", err
			}
			return "", notCovered(g, id)
		}
		if ack {
			root, err := c.isRoot(ctx, h)
			if err != nil {
				return "", err
			}
			if !root {
				return "", protocol.Errorf(protocol.CodeInvalidArgument, "session %s is not a root: its inbox items are claimed by its own activation, never acknowledged by a client", id)
			}
		}
		return h.Scope(), nil
	}
	if auth.Parent == nil {
		return "", protocol.Errorf(protocol.CodeUnauthorized, "the root's own credential or a user grant is required")
	}
	l, err := c.authorize(ctx, *auth.Parent)
	if err != nil {
		return "", err
	}
	if auth.Parent.SessionID != id {
		return "", protocol.Errorf(protocol.CodeUnauthorized, "a root reads only its own inbox, not that of %s", id)
	}
	if l.rec.Kind != protocol.AgentRoot {
		return "", protocol.Errorf(protocol.CodeUnauthorized, "session %s is not a root: its inbox items are claimed by its own activation", id)
	}
	return protocol.ScopeRoot, nil
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

// childFor checks the authority acting on a child, then reads its header;
// it returns the parent's lease when the parent acted. Authority comes
// first, so a caller learns nothing about sessions it may not act on: for
// them an unknown id and another's child answer alike (UNAUTHORIZED). For a
// grant over every session (and for the child's own parent), a followup
// (query false) gets NOT_RESUMABLE for an unknown id or a root session; a
// read-only query gets NOT_FOUND for an unknown id and INVALID_ARGUMENT for
// a root.
func (c *Coordinator) childFor(ctx context.Context, childID string, auth protocol.Authority, query bool) (protocol.SessionHeader, *leaseState, error) {
	if !protocol.ValidID(childID) {
		return protocol.SessionHeader{}, nil, protocol.Errorf(protocol.CodeInvalidArgument, "childId must match ^[A-Za-z0-9_-]{1,64}$")
	}
	var g grantScope
	var parent *leaseState
	switch {
	case auth.Grant != "":
		var err error
		if g, err = c.grantOf(ctx, auth.Grant); err != nil {
			return protocol.SessionHeader{}, nil, err
		}
	case auth.Parent != nil:
		l, err := c.authorize(ctx, *auth.Parent)
		if err != nil {
			return protocol.SessionHeader{}, nil, err
		}
		parent = &l
	default:
		return protocol.SessionHeader{}, nil, protocol.Errorf(protocol.CodeUnauthorized, "the parent's credential or a user grant is required")
	}
	hidden := func() error {
		if parent != nil {
			return protocol.Errorf(protocol.CodeUnauthorized, "session %s is not a child of %s (or does not exist); only its exact live parent may act on it", childID, auth.Parent.SessionID)
		}
		return notCovered(g, childID)
	}
	h, err := c.childHeaderOf(ctx, childID, query)
	if err != nil {
		if !g.all && (errors.Is(err, protocol.ErrNotFound) || errors.Is(err, protocol.ErrNotResumable)) {
			return h, nil, hidden()
		}
		return h, nil, err
	}
	switch {
	case parent != nil && h.ParentSession != auth.Parent.SessionID:
		return h, nil, hidden()
	case parent == nil:
		ok, err := g.covers(ctx, c, h)
		if err != nil {
			return h, nil, err
		}
		if !ok {
			return h, nil, hidden()
		}
	}
	if h.ParentSession == "" || h.Origin != protocol.OriginSubagent {
		if query {
			return h, nil, protocol.Errorf(protocol.CodeInvalidArgument, "session %s is a root session, not a child", h.ID)
		}
		return h, nil, protocol.NewError(protocol.CodeNotResumable, map[string]any{"childId": h.ID, "reason": "it is a root session, not a child"})
	}
	return h, parent, nil
}
