package store

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Grants and drain markers (brood_agents grant.<hash> and drain.<scope>,
// docs/protocol.md §7.6): written only by coordinators. A grant is created once
// when minted (authority.user) and read on every request that carries it; a
// drain marker is put by continuable.drain and deleted when lifted, or by a
// coordinator once the agent it names is gone.

// Grant reads the user grant whose hash (protocol.HashCredential) is
// grantHash. An unknown one is ErrNotFound. A direct get may be answered by
// a replica that has not yet the grant another replica just minted, so an
// absence is read again from the bucket's leader before it is answered
// (only refusals pay for the leader read).
func (s *Store) Grant(ctx context.Context, grantHash string) (Record[protocol.UserGrantRecord], error) {
	rec, err := Get[protocol.UserGrantRecord](ctx, s.Agents, GrantKey(grantHash))
	if errors.Is(err, ErrNotFound) {
		rec, err = GetLatest[protocol.UserGrantRecord](ctx, s.Agents, GrantKey(grantHash))
	}
	return rec, err
}

// CreateGrant stores a minted user grant under its hash, once. The key
// lives ttl (a per-key TTL, rounded up to whole seconds as the server keeps
// them, at least 1 s), so the server removes an expired grant's record.
func (s *Store) CreateGrant(ctx context.Context, grantHash string, rec protocol.UserGrantRecord, ttl time.Duration) error {
	_, err := Create(ctx, s.Agents, GrantKey(grantHash), rec, jetstream.KeyTTL(ttl.Truncate(time.Second)+time.Second))
	return err
}

// PutDrain writes the drain marker of scope (a session id, or DrainAll).
func (s *Store) PutDrain(ctx context.Context, scope string, rec protocol.DrainRecord) error {
	_, err := Put(ctx, s.Agents, DrainKey(scope), rec)
	return err
}

// DeleteDrain removes the drain marker of scope; an absent one is no error.
func (s *Store) DeleteDrain(ctx context.Context, scope string) error {
	return Delete(ctx, s.Agents, DrainKey(scope), 0)
}
