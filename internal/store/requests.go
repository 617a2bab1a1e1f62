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

// RequestTTL is how long a request's record outlives its last write (a
// day): long enough for its child to read its answer after a restart and
// for `brood requests --all` to show it; the server then removes it.
const RequestTTL = 24 * time.Hour

// Request reads request id from the bucket's leader (an answer decides on
// it). None is ErrNotFound.
func (s *Store) Request(ctx context.Context, id string) (Record[protocol.RequestRecord], error) {
	return GetLatest[protocol.RequestRecord](ctx, s.Agents, RequestKey(id))
}

// CreateRequest writes a new pending request once; an existing one is
// ErrConflict (unless it is this very record).
func (s *Store) CreateRequest(ctx context.Context, rec protocol.RequestRecord) (uint64, error) {
	ttl := time.Until(time.UnixMilli(rec.Deadline)) + RequestTTL
	return Create(ctx, s.Agents, RequestKey(rec.ID), rec, jetstream.KeyTTL(ttl.Truncate(time.Second)+time.Second))
}

// AnswerRequest writes the answered request by compare-and-set at rev,
// the revision it was read pending at: ErrConflict when another answer
// (or the timeout) moved it first.
func (s *Store) AnswerRequest(ctx context.Context, rec protocol.RequestRecord, rev uint64) (uint64, error) {
	return UpdateTTL(ctx, s.Agents, RequestKey(rec.ID), rec, rev, RequestTTL)
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
	lister, err := s.Agents.ListKeysFiltered(ctx, prefixRequest+">")
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
		ids = append(ids, k[len(prefixRequest):])
	}
	return ids, more, nil
}
