package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/pkg/protocol"
)

// prefixRequest is the brood_agents prefix of request records
// (request.<requestId>, protocol.RequestRecord), which only coordinators
// write (docs/protocol.md §5.21).
const prefixRequest = "request."

// RequestKey is the brood_agents key of request id.
func RequestKey(id string) string { return prefixRequest + id }

// prefixRequestPending is the brood_agents prefix of the pending-request
// index (requestpending.<requestId>, its value the asking session's id):
// one key per request while it is pending (then for a second more, its
// value emptied), so requests.list reads the
// pending ones without reading every record of the last day. Written
// before the record (an index key without its record is stale, and
// removed by the listing that finds it), removed when an answer, a timeout
// or the end of the asking turn moves the record out of pending.
const prefixRequestPending = "requestpending."

// RequestPendingKey is the brood_agents key of request id in the
// pending-request index.
func RequestPendingKey(id string) string { return prefixRequestPending + id }

// RequestTTL is how long a request's record outlives its last write (a
// day): long enough for its child to read its answer after a restart and
// for `brood requests --all` to show it; the server then removes it.
const RequestTTL = 24 * time.Hour

// Request reads request id from the bucket's leader (an answer decides on
// it). None is ErrNotFound.
func (s *Store) Request(ctx context.Context, id string) (Record[protocol.RequestRecord], error) {
	return GetLatest[protocol.RequestRecord](ctx, s.Agents, RequestKey(id))
}

// CreateRequest writes a new pending request once, its pending-index key
// first; an existing record is ErrConflict (unless it is this very record).
// Both keys live until a day after the deadline.
func (s *Store) CreateRequest(ctx context.Context, rec protocol.RequestRecord) (uint64, error) {
	ttl := jetstream.KeyTTL((time.Until(time.UnixMilli(rec.Deadline)) + RequestTTL).Truncate(time.Second) + time.Second)
	if _, err := Create(ctx, s.Agents, RequestPendingKey(rec.ID), rec.SessionID, ttl); err != nil && !errors.Is(err, ErrConflict) {
		return 0, fmt.Errorf("index the pending request %s: %w", rec.ID, err)
	}
	return Create(ctx, s.Agents, RequestKey(rec.ID), rec, ttl)
}

// AnswerRequest writes the answered request by compare-and-set at rev,
// the revision it was read pending at: ErrConflict when another answer
// (or the timeout) moved it first. A record no longer pending leaves the
// pending index (UnlistRequest).
func (s *Store) AnswerRequest(ctx context.Context, rec protocol.RequestRecord, rev uint64) (uint64, error) {
	nrev, err := UpdateTTL(ctx, s.Agents, RequestKey(rec.ID), rec, rev, RequestTTL)
	if err == nil && rec.State != protocol.RequestPending {
		err = s.UnlistRequest(ctx, rec.ID)
	}
	return nrev, err
}

// UnlistRequest removes request id from the pending index: its key is
// rewritten with a TTL of a second, after which the server removes it
// (brood_agents allows no purge). Idempotent: a key already gone, or
// rewritten meanwhile by another unlisting, is no error. The record is
// untouched.
func (s *Store) UnlistRequest(ctx context.Context, id string) error {
	key := RequestPendingKey(id)
	cur, err := GetLatest[string](ctx, s.Agents, key)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err == nil {
		_, err = UpdateTTL(ctx, s.Agents, key, "", cur.Revision, time.Second)
	}
	if err != nil && !errors.Is(err, ErrConflict) {
		return fmt.Errorf("unlist the request %s: %w", id, err)
	}
	return nil
}

// PendingRequestIDs lists the ids in the pending-request index, at most
// max of them (more reports whether there were others): the requests
// pending now, each parked on a turn, plus any whose index key a crash
// left behind (the caller reads each record, and unlists those that are
// no longer pending or gone).
func (s *Store) PendingRequestIDs(ctx context.Context, max int) (ids []string, more bool, err error) {
	return s.keyIDs(ctx, prefixRequestPending, max)
}

// PassRequest writes the pending request passed up (a new handler) by
// compare-and-set at rev: ErrConflict when it changed first. Its TTL stays
// its deadline's, as at its creation.
func (s *Store) PassRequest(ctx context.Context, rec protocol.RequestRecord, rev uint64) (uint64, error) {
	ttl := time.Until(time.UnixMilli(rec.Deadline)) + RequestTTL
	return UpdateTTL(ctx, s.Agents, RequestKey(rec.ID), rec, rev, ttl.Truncate(time.Second)+time.Second)
}

// RequestIDs lists the ids of the request records the bucket holds, at
// most max of them (more reports whether there were others).
func (s *Store) RequestIDs(ctx context.Context, max int) (ids []string, more bool, err error) {
	return s.keyIDs(ctx, prefixRequest, max)
}

// keyIDs lists the ids of brood_agents keys prefix<id>, at most max.
func (s *Store) keyIDs(ctx context.Context, prefix string, max int) (ids []string, more bool, err error) {
	lister, err := s.Agents.ListKeysFiltered(ctx, prefix+">")
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("list requests: %w", err)
	}
	defer lister.Stop()
	for k := range lister.Keys() {
		if len(ids) == max {
			more = true
			continue
		}
		ids = append(ids, k[len(prefix):])
	}
	return ids, more, nil
}
