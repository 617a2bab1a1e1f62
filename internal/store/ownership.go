package store

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Ownership (brood_agents owns.<scope>.<parent>, scope the parent's (OwnsKey), docs/protocol.md §7.6; docs/design.md §7,
// Ownership): the live continuable children a continuable parent owns, so it
// cannot settle while one of them lives. The coordinator adds the edge when
// it starts, resumes or follows up a child of a continuable parent (before
// the child's epoch can end, so the release cannot come first); whoever ends
// the child's epoch (its host, or the coordinator on HOST_LOST) removes it
// after the settlement notice reached the parent's inbox (EndEpoch). Every
// change is a compare-and-set retried on conflict, so concurrent adds and
// removals lose nothing; an empty record is deleted.

// OwnershipAttemptsMax bounds the compare-and-set attempts of one ownership
// change.
const OwnershipAttemptsMax = 16

// Ownership reads parent's ownership record, under the scope its header
// names (sessionFacts). None (or no header) is ErrNotFound.
func (s *Store) Ownership(ctx context.Context, parent string) (Record[protocol.OwnershipRecord], error) {
	key, err := s.ownsKey(ctx, parent)
	if err != nil {
		return Record[protocol.OwnershipRecord]{}, err
	}
	return Get[protocol.OwnershipRecord](ctx, s.Agents, key)
}

// OwnershipLatest is Ownership answered by the bucket's leader (GetLatest):
// whether a parent may settle rests on it.
func (s *Store) OwnershipLatest(ctx context.Context, parent string) (Record[protocol.OwnershipRecord], error) {
	key, err := s.ownsKey(ctx, parent)
	if err != nil {
		return Record[protocol.OwnershipRecord]{}, err
	}
	return GetLatest[protocol.OwnershipRecord](ctx, s.Agents, key)
}

// OwnershipLatestOf is OwnershipLatest of a parent of scope known to the
// caller (a host's own child): no header read, and only the key its own
// provider's workers may read (OwnsKey).
func (s *Store) OwnershipLatestOf(ctx context.Context, scope, parent string) (Record[protocol.OwnershipRecord], error) {
	return GetLatest[protocol.OwnershipRecord](ctx, s.Agents, OwnsKey(scope, parent))
}

// ownsKey is parent's OwnsKey under the scope its header names.
func (s *Store) ownsKey(ctx context.Context, parent string) (string, error) {
	f, err := s.sessionFacts(ctx, parent)
	if err != nil {
		return "", fmt.Errorf("the ownership record of %s: %w", parent, err)
	}
	return OwnsKey(f.scope, parent), nil
}

// AddOwnership records that parent owns child (idempotent).
func (s *Store) AddOwnership(ctx context.Context, parent, child string) error {
	return s.changeOwnership(ctx, parent, func(children []string) []string {
		if slices.Contains(children, child) {
			return nil
		}
		return append(children, child)
	})
}

// RemoveOwnership records that parent no longer owns child (idempotent).
func (s *Store) RemoveOwnership(ctx context.Context, parent, child string) error {
	return s.changeOwnership(ctx, parent, func(children []string) []string {
		if !slices.Contains(children, child) {
			return nil
		}
		return slices.DeleteFunc(slices.Clone(children), func(c string) bool { return c == child })
	})
}

// changeOwnership applies change to parent's children (nil: no change) by
// compare-and-set, creating the record when absent and deleting it when
// change leaves it empty.
func (s *Store) changeOwnership(ctx context.Context, parent string, change func([]string) []string) error {
	key, err := s.ownsKey(ctx, parent)
	if err != nil {
		return err
	}
	for range OwnershipAttemptsMax {
		cur, err := GetLatest[protocol.OwnershipRecord](ctx, s.Agents, key)
		switch {
		case errors.Is(err, ErrNotFound):
			next := change(nil)
			if next == nil {
				return nil
			}
			_, err = Create(ctx, s.Agents, key, protocol.OwnershipRecord{Children: next})
		case err != nil:
			return err
		default:
			next := change(cur.Value.Children)
			if next == nil {
				return nil
			}
			if len(next) == 0 {
				err = Delete(ctx, s.Agents, key, cur.Revision)
			} else {
				_, err = Update(ctx, s.Agents, key, protocol.OwnershipRecord{Children: next}, cur.Revision)
			}
		}
		if !errors.Is(err, ErrConflict) {
			return err
		}
	}
	return fmt.Errorf("the ownership record of %s kept changing during %d attempts", parent, OwnershipAttemptsMax)
}
