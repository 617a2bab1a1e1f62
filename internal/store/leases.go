package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Leases (brood_agents lease.<provider>.<sessionId> of a child,
// root.<sessionId> of a root; docs/protocol.md §7.6): the holder of a
// session's lease is the one writer of its log. A lease is created by the
// host that starts a one-shot run or an epoch (a root's by a coordinator,
// for the client), renewed or marked by compare-and-set at the revision its
// holder last wrote, taken over by a coordinator when its host died, and
// released by a delete at that revision, so a holder that lost it changes
// nothing.

// Lease reads a session's lease. A missing one (or a missing session) is
// ErrNotFound. Its key comes from the session's header (SessionScope),
// never from a lease: a root's is RootLeaseKey, a child's LeaseKey of the
// provider its header names. A record there that is not that session's
// lease (LeaseBelongs) is ErrMisfiledLease, which is also ErrNotFound.
func (s *Store) Lease(ctx context.Context, sessionID string) (Record[protocol.AgentRecord], error) {
	return s.readLease(ctx, sessionID, Get[protocol.AgentRecord])
}

// LeaseLatest is Lease answered by the bucket's leader (GetLatest), for a
// decision that rests on the lease's absence or state.
func (s *Store) LeaseLatest(ctx context.Context, sessionID string) (Record[protocol.AgentRecord], error) {
	return s.readLease(ctx, sessionID, GetLatest[protocol.AgentRecord])
}

func (s *Store) readLease(ctx context.Context, id string, get func(context.Context, jetstream.KeyValue, string) (Record[protocol.AgentRecord], error)) (Record[protocol.AgentRecord], error) {
	f, err := s.sessionFacts(ctx, id)
	if err != nil {
		return Record[protocol.AgentRecord]{}, err
	}
	key := LeaseKeyFor(id, f.scope)
	rec, err := get(ctx, s.Agents, key)
	if err != nil {
		return rec, err
	}
	if err := f.owns(key, rec.Value); err != nil {
		return Record[protocol.AgentRecord]{}, err
	}
	return rec, nil
}

// ChildLeaseLatest is LeaseLatest of a child of provider known to the
// caller (a host's own): no header read. A record under its key that is
// not its lease (another session's, kind or provider) is ErrMisfiledLease.
func (s *Store) ChildLeaseLatest(ctx context.Context, provider, childID string) (Record[protocol.AgentRecord], error) {
	key := LeaseKey(provider, childID)
	rec, err := GetLatest[protocol.AgentRecord](ctx, s.Agents, key)
	if err != nil {
		return rec, err
	}
	if LeaseKeyOf(rec.Value) != key {
		return Record[protocol.AgentRecord]{}, misfiled(key, rec.Value, keyDisagrees)
	}
	return rec, nil
}

// ReleaseChildLease is ReleaseLease of a child of provider known to the
// caller (a host's own): no header read.
func (s *Store) ReleaseChildLease(ctx context.Context, provider, childID string, rev uint64) error {
	return Delete(ctx, s.Agents, LeaseKey(provider, childID), rev)
}

// ErrMisfiledLease is a lease record under a key it does not belong under
// (LeaseBelongs): read, it is no lease; errors.Is(err, ErrNotFound) holds
// for it too.
var ErrMisfiledLease = errors.New("store: a record under a lease key that is not that session's lease")

func misfiled(key string, rec protocol.AgentRecord, why string) error {
	return fmt.Errorf("%w (%w): %s holds session %q, kind %q, provider %q, parent %q: %s",
		ErrMisfiledLease, ErrNotFound, key, rec.SessionID, rec.Kind, rec.Provider, rec.ParentSession, why)
}

// LeaseBelongs reports whether rec, found under the brood_agents key key,
// is the lease of the session it names: key is the one rec belongs under
// (LeaseKeyOf: its session id, its kind root or not, its provider), and for
// a child's lease the session's header (which only coordinators write)
// names the same provider and parent. nil when it belongs,
// ErrMisfiledLease when it does not (or names a session without a
// header), another error when the header could not be read. A worker may
// write its own provider's leases only (docs/security.md); this is what
// keeps what it writes there from passing for another provider's child, or
// for a child of another parent (counted against that parent's live
// children, disposed with its tree).
func (s *Store) LeaseBelongs(ctx context.Context, key string, rec protocol.AgentRecord) error {
	if LeaseKeyOf(rec) != key {
		return misfiled(key, rec, keyDisagrees)
	}
	if kind, _ := KindOf(key); kind != KindLease {
		return nil // a root's lease: only coordinators write root.>
	}
	f, err := s.sessionFacts(ctx, rec.SessionID)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return misfiled(key, rec, "its session has no header")
		}
		return err
	}
	return f.owns(key, rec)
}

// sessionFact is what a session's header says about its lease: its scope
// (protocol.SessionHeader.Scope) and, for a child, its parent.
type sessionFact struct{ scope, parent string }

// owns checks that rec, found under key, is the lease of the session whose
// header says f: key is the one the header names (LeaseKeyFor its scope),
// the record names that key (LeaseKeyOf) and, for a child, the header's
// parent.
func (f sessionFact) owns(key string, rec protocol.AgentRecord) error {
	switch {
	case LeaseKeyOf(rec) != key:
		return misfiled(key, rec, keyDisagrees)
	case LeaseKeyFor(rec.SessionID, f.scope) != key:
		return misfiled(key, rec, "its header's scope is "+f.scope)
	case f.scope != protocol.ScopeRoot && rec.ParentSession != f.parent:
		return misfiled(key, rec, "its header's parent is "+f.parent)
	}
	return nil
}

// keyDisagrees says why a record is not the lease of the key it is under.
const keyDisagrees = "it belongs under another key (its session, kind or provider)"

// CreateLease writes rec as its session's lease if the session has none
// (ErrConflict: a live lease exists elsewhere). It returns the revision the
// holder's later writes name.
func (s *Store) CreateLease(ctx context.Context, rec protocol.AgentRecord) (uint64, error) {
	if err := leaseKeyable(rec); err != nil {
		return 0, err
	}
	return Create(ctx, s.Agents, LeaseKeyOf(rec), rec)
}

// leaseKeyable refuses a lease that names no key of the layout: a child's
// needs its session id and its header's provider (LeaseKey), a root's its
// session id.
func leaseKeyable(rec protocol.AgentRecord) error {
	if !protocol.ValidID(rec.SessionID) || (rec.Kind != protocol.AgentRoot && !protocol.ValidID(rec.Provider)) {
		return fmt.Errorf("a lease of session %q, kind %q, provider %q: a child's lease names its session and provider, a root's its session", rec.SessionID, rec.Kind, rec.Provider)
	}
	return nil
}

// UpdateLease writes rec over its session's lease by compare-and-set at rev
// (a renewal, a run marked Ending, a root reopened); ErrConflict when the
// lease changed since.
func (s *Store) UpdateLease(ctx context.Context, rec protocol.AgentRecord, rev uint64) (uint64, error) {
	if err := leaseKeyable(rec); err != nil {
		return 0, err
	}
	return Update(ctx, s.Agents, LeaseKeyOf(rec), rec, rev)
}

// ReleaseLease deletes a session's lease if it is still at rev (ErrConflict
// otherwise: it changed hands; ErrNotFound for a session without a header).
// rev 0 deletes it whatever it holds (only for a lease whose holder is known
// gone).
func (s *Store) ReleaseLease(ctx context.Context, sessionID string, rev uint64) error {
	key, err := s.leaseKey(ctx, sessionID)
	if err != nil {
		return err
	}
	return Delete(ctx, s.Agents, key, rev)
}

// leaseKey is the key of session id's lease, by its header's scope;
// ErrNotFound for a session without a header (it has no lease).
func (s *Store) leaseKey(ctx context.Context, id string) (string, error) {
	f, err := s.sessionFacts(ctx, id)
	if err != nil {
		return "", err
	}
	return LeaseKeyFor(id, f.scope), nil
}

// SessionScope returns the scope of session id from its header (which only
// coordinators write, once): protocol.ScopeRoot for a root, else the
// provider it was started on (protocol.SessionHeader.Scope). A session
// without a header has scope "". Answers are cached (headers never change),
// up to rootsCachedMax sessions.
func (s *Store) SessionScope(ctx context.Context, id string) (string, error) {
	f, err := s.sessionFacts(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return "", nil
	}
	return f.scope, err
}

// sessionFacts reads what session id's header says about its lease
// (cached); ErrNotFound for a session without a header.
func (s *Store) sessionFacts(ctx context.Context, id string) (sessionFact, error) {
	if v, ok := s.roots.Load(id); ok {
		return v.(sessionFact), nil
	}
	h, err := s.GetHeader(ctx, id)
	if errors.Is(err, ErrNotFound) {
		// A replica that is not yet current may lack a header just
		// written: its absence is confirmed by the stream's leader.
		m, lerr := s.leaderLast(ctx, s.Subj.StreamSessions(), s.Subj.Session(id))
		switch {
		case errors.Is(lerr, jetstream.ErrMsgNotFound):
			// No session (not cached: it may come).
			return sessionFact{}, fmt.Errorf("the lease of %s: no session header: %w", id, ErrNotFound)
		case lerr != nil:
			return sessionFact{}, fmt.Errorf("read the header of %s: %w", id, lerr)
		}
		if err = protocol.Unmarshal(protocol.Msgpack, m.Data, &h); err != nil {
			return sessionFact{}, fmt.Errorf("decode header of %s: %w", id, err)
		}
	} else if err != nil {
		return sessionFact{}, fmt.Errorf("read the header of %s: %w", id, err)
	}
	return s.rememberHeader(h), nil
}

// rememberHeader caches what header h says about its session's lease and
// scope (sessionFacts): a header is written once and never changes.
func (s *Store) rememberHeader(h protocol.SessionHeader) sessionFact {
	f := sessionFact{scope: h.Scope(), parent: h.ParentSession}
	if s.rootsCached.Add(1) > rootsCachedMax {
		s.roots.Clear()
		s.rootsCached.Store(1)
	}
	s.roots.Store(h.ID, f)
	return f
}

// rootsCachedMax bounds the sessions SessionScope remembers; past it the cache
// starts over (headers are read again).
const rootsCachedMax = 100_000

// TakeOverLease moves the lease cur (as read, with its revision) to the
// coordinator `by` whose host died: HostID and TakenOverBy become by and the
// epoch goes up by one, by compare-and-set at cur's revision, so of the
// replicas racing for it exactly one wins and the dead host's later writes
// (fenced on the lease's epoch and on the log) are refused. ErrConflict: the
// lease changed since cur was read (another replica won, or the host came
// back and wrote). A lease already taken over by `by` (a takeover resumed
// after a failure) is returned as it is.
func (s *Store) TakeOverLease(ctx context.Context, cur Record[protocol.AgentRecord], by string) (Record[protocol.AgentRecord], error) {
	if cur.Value.TakenOverBy == by {
		return cur, nil
	}
	taken := cur.Value
	taken.HostID, taken.TakenOverBy = by, by
	taken.Epoch++
	rev, err := s.UpdateLease(ctx, taken, cur.Revision)
	if err != nil {
		return cur, err
	}
	return Record[protocol.AgentRecord]{Value: taken, Revision: rev}, nil
}

// EndedAncestor returns the first session of ancestry (ids, root first) that
// is a one-shot agent whose run ended or is ending (its lease gone, Ending,
// or taken over from a dead host), or "" when there is none (docs/design.md §14:
// nothing under an ended one-shot run starts work again). A session with no
// lease is one-shot when its parent's child index says so, else when the
// descriptor in its own log does; roots (no parent) never count as ended.
func (s *Store) EndedAncestor(ctx context.Context, ancestry []string) (string, error) {
	for _, id := range ancestry {
		rec, err := s.LeaseLatest(ctx, id)
		switch {
		case err == nil:
			if rec.Value.Kind == protocol.AgentOneShot && (rec.Value.Ending || rec.Value.TakenOverBy != "") {
				return id, nil
			}
			continue
		case !errors.Is(err, ErrNotFound):
			return "", fmt.Errorf("read the lease of %s: %w", id, err)
		}
		h, err := s.GetHeader(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("read the header of %s: %w", id, err)
		}
		if h.ParentSession == "" {
			continue // a root
		}
		mode, err := s.modeOf(ctx, h)
		if err != nil {
			return "", err
		}
		if mode == protocol.ModeOneShot {
			return id, nil
		}
	}
	return "", nil
}

// modeOf returns a child's mode from its parent's child index, else (a
// one-shot entry is written off the start's path, so it may be missing) from
// the descriptor in the child's own log; "" for a session with neither (a
// lineage root).
func (s *Store) modeOf(ctx context.Context, h protocol.SessionHeader) (string, error) {
	e, err := s.ChildIndexEntry(ctx, h.ParentSession, h.ID)
	if err == nil {
		return e.Mode, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return "", fmt.Errorf("read the child index entry of %s: %w", h.ID, err)
	}
	log, err := s.ReadLog(ctx, h.Scope(), h.ID)
	if err != nil {
		return "", fmt.Errorf("read the log of %s: %w", h.ID, err)
	}
	return sessionlog.Mode(log.Events, h.SeedLength), nil
}
