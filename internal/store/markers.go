package store

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Grants, drain markers and live-children slots (brood_agents grant.<hash>,
// drain.<scope> and slots.<parent>, docs/protocol.md §7.6): written only by
// coordinators. A grant is created once
// when minted (authority.user) and read on every request that carries it; a
// drain marker is put by continuable.drain and deleted when lifted, or by a
// coordinator once the agent it names is gone; a slot record is written by
// compare-and-set by every admission of a child of its parent (and a cold
// resume of one), and by a start that failed releasing its slot.

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

// Slots reads parent's live-children slot record from the bucket's leader
// (GetLatest): a follower just elected, or catching up after a restart,
// may answer a direct get with a revision already superseded, and every
// compare-and-set from it would conflict. None is ErrNotFound.
func (s *Store) Slots(ctx context.Context, parent string) (Record[protocol.ChildSlotsRecord], error) {
	return GetLatest[protocol.ChildSlotsRecord](ctx, s.Agents, SlotsKey(parent))
}

// WriteSlots writes parent's slot record by compare-and-set at rev, the
// revision its writer last read (0: the record must not exist yet), and
// returns the new revision; ErrConflict when it changed since.
func (s *Store) WriteSlots(ctx context.Context, parent string, rec protocol.ChildSlotsRecord, rev uint64) (uint64, error) {
	if rev == 0 {
		return Create(ctx, s.Agents, SlotsKey(parent), rec)
	}
	return Update(ctx, s.Agents, SlotsKey(parent), rec, rev)
}

// StartQueue reads parent's start queue from the bucket's leader
// (GetLatest), as Slots does: every change writes it by compare-and-set.
// None is ErrNotFound.
func (s *Store) StartQueue(ctx context.Context, parent string) (Record[protocol.StartQueueRecord], error) {
	return GetLatest[protocol.StartQueueRecord](ctx, s.Agents, StartQueueKey(parent))
}

// WriteStartQueue writes parent's start queue by compare-and-set at rev (0:
// the record must not exist yet) and returns the new revision; ErrConflict
// when it changed since. An emptied queue is written empty with a
// per-message TTL of StartQueueEmptyTTL, never deleted by a writer: the
// server removes it unless a write replaces it first, and a writer that read
// it before then conflicts, reads it gone and creates it.
func (s *Store) WriteStartQueue(ctx context.Context, parent string, rec protocol.StartQueueRecord, rev uint64) (uint64, error) {
	switch {
	case rev == 0:
		return Create(ctx, s.Agents, StartQueueKey(parent), rec)
	case len(rec.Entries) == 0:
		return UpdateTTL(ctx, s.Agents, StartQueueKey(parent), rec, rev, StartQueueEmptyTTL)
	}
	return Update(ctx, s.Agents, StartQueueKey(parent), rec, rev)
}

// StartQueueEmptyTTL is how long an emptied start queue record stays.
const StartQueueEmptyTTL = time.Minute

// UserRoots reads user's open-root slot record from the bucket's leader
// (GetLatest), as Slots does and for the same reason. None is ErrNotFound.
func (s *Store) UserRoots(ctx context.Context, user string) (Record[protocol.UserRootsRecord], error) {
	return GetLatest[protocol.UserRootsRecord](ctx, s.Agents, UserRootsKey(user))
}

// WriteUserRoots writes user's open-root slot record by compare-and-set at
// rev, the revision its writer last read (0: the record must not exist
// yet), and returns the new revision; ErrConflict when it changed since.
func (s *Store) WriteUserRoots(ctx context.Context, user string, rec protocol.UserRootsRecord, rev uint64) (uint64, error) {
	if rev == 0 {
		return Create(ctx, s.Agents, UserRootsKey(user), rec)
	}
	return Update(ctx, s.Agents, UserRootsKey(user), rec, rev)
}

// Budget reads the ledger of the budget session named (budget.<session>)
// from the bucket's leader (GetLatest), as Slots does: every reservation
// writes it by compare-and-set. None is ErrNotFound.
func (s *Store) Budget(ctx context.Context, session string) (Record[protocol.BudgetRecord], error) {
	return GetLatest[protocol.BudgetRecord](ctx, s.Agents, BudgetKey(session))
}

// WriteBudget writes a ledger by compare-and-set at rev (0: create it) and
// returns the new revision; ErrConflict when it changed since (or, at 0,
// exists).
func (s *Store) WriteBudget(ctx context.Context, session string, rec protocol.BudgetRecord, rev uint64) (uint64, error) {
	if rev == 0 {
		return Create(ctx, s.Agents, BudgetKey(session), rec)
	}
	return Update(ctx, s.Agents, BudgetKey(session), rec, rev)
}
