package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/brood-dev/brood/pkg/protocol"
)

// The records the collector (services/collector; docs/security.md,
// "Garbage collection") reads and removes. A root's tree is the root and
// every session its child index reaches, recursively; its records are each
// session's header and child index (BROOD_SESSIONS), log (its scope's
// BROOD_LOG_<scope>),
// slot record (brood_agents slots.<id>) and budget ledger (budget.<id>,
// when the session named a budget: docs/protocol.md §5.5), and the root's
// closed marker (closed.<id>). Headers and logs are removed by a purge of their subjects,
// which the streams allow (provision.go) and a deployment lets only the
// collector user do (docs/security.md); KV records by a delete marker
// that carries a per-message TTL (KVMarkerTTL), so nothing of a collected
// tree stays behind.

// KVMarkerTTL is how long the delete marker the collector leaves for a KV
// key lives (the server removes it then): long enough for every watcher to
// see the delete. A variable for tests only.
var KVMarkerTTL = time.Hour

// PutClosedRoot marks root id closed at closedAt (epoch ms): coordinators
// write it before they delete a root's lease (agents.close, a lapsed lease),
// so a root whose lease is gone always has its marker.
func (s *Store) PutClosedRoot(ctx context.Context, id string, closedAt int64) error {
	_, err := Put(ctx, s.Agents, ClosedRootKey(id), protocol.ClosedRootRecord{ClosedAt: closedAt})
	return err
}

// ClosedRoot is one closed-root marker: the root, when it was closed (epoch
// ms) and the marker's revision.
type ClosedRoot struct {
	SessionID string
	ClosedAt  int64
	Revision  uint64
}

// closedRootsBatch is how many markers one batch direct get asks for.
const closedRootsBatch = 256

// ClosedRoots lists at most max closed-root markers, oldest marker first,
// with batch direct gets (no consumer): the keys closed.* of brood_agents.
// A marker deleted since (a delete marker) is not listed.
func (s *Store) ClosedRoots(ctx context.Context, max int) ([]ClosedRoot, error) {
	stream := kvStreamPrefix + s.Subj.BucketAgents()
	subject := "$KV." + s.Subj.BucketAgents() + "." + ClosedRootKey("*")
	var out []ClosedRoot
	next := uint64(1)
	for len(out) < max {
		msgs, err := jetstreamext.GetBatch(ctx, s.JS, stream, closedRootsBatch,
			jetstreamext.GetBatchSubject(subject), jetstreamext.GetBatchSeq(next))
		if err != nil {
			return nil, fmt.Errorf("list the closed roots: %w", err)
		}
		got := 0
		for m, err := range msgs {
			if err != nil {
				if errors.Is(err, jetstreamext.ErrNoMessages) {
					break
				}
				return nil, fmt.Errorf("list the closed roots: %w", err)
			}
			next, got = m.Sequence+1, got+1
			if m.Header.Get(kvOperation) != "" || len(out) >= max {
				continue // deleted
			}
			_, id := KindOf(m.Subject[len("$KV."+s.Subj.BucketAgents()+"."):])
			var rec protocol.ClosedRootRecord
			if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &rec); err != nil {
				continue
			}
			out = append(out, ClosedRoot{SessionID: id, ClosedAt: rec.ClosedAt, Revision: m.Sequence})
		}
		if got < closedRootsBatch {
			break
		}
	}
	return out, nil
}

// kvOperation is the header of a KV delete or purge marker (nats.go).
const kvOperation = "KV-Operation"

// TreeSession is one session of a root's tree: its id and scope (ScopeRoot
// for the root, the child's provider otherwise), which name its log subject
// and lease key.
type TreeSession struct {
	ID, Scope string
}

// ErrTreeTooLarge: a tree has more sessions than the walk may visit.
var ErrTreeTooLarge = errors.New("store: the tree has more sessions than the collector visits")

// Tree returns root and every session below it that the child indexes
// reach, parents before their children; more than max sessions is
// ErrTreeTooLarge.
func (s *Store) Tree(ctx context.Context, root string, max int) ([]TreeSession, error) {
	out := []TreeSession{{ID: root, Scope: protocol.ScopeRoot}}
	for i := 0; i < len(out); i++ {
		children, err := s.ChildIndex(ctx, out[i].ID)
		if err != nil {
			return nil, err
		}
		for _, c := range children {
			if len(out) >= max {
				return nil, fmt.Errorf("%w (%d)", ErrTreeTooLarge, max)
			}
			out = append(out, TreeSession{ID: c.ChildID, Scope: c.Provider})
		}
	}
	return out, nil
}

// SessionActivity is what the collector must know of one session before it
// removes its records, read from the streams' and bucket's leaders.
type SessionActivity struct {
	// Leased: the session's lease exists (a live agent, or one a
	// coordinator has yet to take over or expire).
	Leased bool
	// Pending: its inbox holds an item (an accepted message not yet
	// claimed).
	Pending bool
	// LastWrite is the time of its last log record, or of its header when
	// its log is empty (zero when it has neither).
	LastWrite time.Time
	// Header is its header as stored (nil when gone), to put back should the
	// collection stop after removing it.
	Header *protocol.SessionHeader
}

// Activity reads the lease, inbox, log tail and header of session n.
func (s *Store) Activity(ctx context.Context, n TreeSession) (SessionActivity, error) {
	var a SessionActivity
	lease, err := readLeader(ctx, s.Agents, LeaseKeyFor(n.ID, n.Scope))
	if err != nil {
		return a, fmt.Errorf("read the lease of %s: %w", n.ID, err)
	}
	a.Leased = lease.found
	last := func(stream, subject string) (*jetstream.RawStreamMsg, error) {
		var m *jetstream.RawStreamMsg
		err := Retry(ctx, func(ctx context.Context) (err error) {
			m, err = s.leaderLast(ctx, stream, subject)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				m, err = nil, nil
			}
			return err
		})
		return m, err
	}
	m, err := last(s.Subj.StreamInbox(n.Scope), s.Subj.Inbox(n.Scope, n.ID))
	if err != nil {
		return a, fmt.Errorf("read the inbox of %s: %w", n.ID, err)
	}
	a.Pending = m != nil
	if m, err = last(s.Subj.StreamSessions(), s.Subj.Session(n.ID)); err != nil {
		return a, fmt.Errorf("read the header of %s: %w", n.ID, err)
	}
	if m != nil {
		a.LastWrite = m.Time
		var h protocol.SessionHeader
		if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &h); err == nil {
			a.Header = &h
		}
	}
	if m, err = last(s.Subj.StreamLog(n.Scope), s.Subj.Log(n.Scope, n.ID)); err != nil {
		return a, fmt.Errorf("read the log of %s: %w", n.ID, err)
	}
	if m != nil && m.Time.After(a.LastWrite) {
		a.LastWrite = m.Time
	}
	return a, nil
}

// PurgeHeader removes session id's header from BROOD_SESSIONS.
func (s *Store) PurgeHeader(ctx context.Context, id string) error {
	return s.purge(ctx, s.Sessions, s.Subj.Session(id))
}

// PurgeSession removes the rest of session n's records: its log (from its
// scope's log stream), its child index, its slot record and its budget's
// ledger (a ledger lives as long as its session's tree: nothing under a
// collected root spends any more).
func (s *Store) PurgeSession(ctx context.Context, n TreeSession) error {
	log, err := s.LogStream(ctx, n.Scope)
	if err != nil {
		return err
	}
	if err := s.purge(ctx, log, s.Subj.Log(n.Scope, n.ID)); err != nil {
		return err
	}
	if err := s.purge(ctx, s.Sessions, s.Subj.ChildrenOf(n.ID)); err != nil {
		return err
	}
	if err := s.deleteExpiring(ctx, s.Agents, SlotsKey(n.ID), 0); err != nil {
		return err
	}
	return s.deleteExpiring(ctx, s.Agents, BudgetKey(n.ID), 0)
}

// DeleteClosedRoot removes a closed-root marker if it is still at rev (a
// root closed again since keeps its newer marker).
func (s *Store) DeleteClosedRoot(ctx context.Context, id string, rev uint64) error {
	err := s.deleteExpiring(ctx, s.Agents, ClosedRootKey(id), rev)
	if errors.Is(err, ErrConflict) {
		return nil
	}
	return err
}

func (s *Store) purge(ctx context.Context, str jetstream.Stream, subject string) error {
	return Retry(ctx, func(ctx context.Context) error {
		return str.Purge(ctx, jetstream.WithPurgeSubject(subject))
	})
}

// deleteExpiring deletes key with a delete marker that expires after
// KVMarkerTTL (a plain KV delete leaves its marker for good, the bucket
// keeping one message per key), if the key is still at rev (0: whatever it
// holds). A key never written, or already deleted, is left as it is.
func (s *Store) deleteExpiring(ctx context.Context, kv jetstream.KeyValue, key string, rev uint64) error {
	subject := "$KV." + kv.Bucket() + "." + key
	return Retry(ctx, func(ctx context.Context) error {
		cur, err := s.leaderLast(ctx, kvStreamPrefix+kv.Bucket(), subject)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return nil
		case err != nil:
			return err
		case cur.Header.Get(kvOperation) != "":
			return nil
		case rev != 0 && cur.Sequence != rev:
			return fmt.Errorf("%w: %s/%s changed since revision %d", ErrConflict, kv.Bucket(), key, rev)
		}
		m := nats.NewMsg(s.kvWriteSubject(kv.Bucket(), key))
		m.Header.Set(kvOperation, "DEL")
		_, err = s.JS.PublishMsg(ctx, m, jetstream.WithMsgTTL(KVMarkerTTL), jetstream.WithExpectLastSequencePerSubject(cur.Sequence))
		if isWrongLastSeq(err) {
			return errBusy // written since: read it again
		}
		return err
	})
}
