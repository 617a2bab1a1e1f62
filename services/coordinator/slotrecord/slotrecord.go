// Package slotrecord is the coordinator's slot records (docs/design.md §4,
// agent limits; RELIABILITY.md I8; docs/security.md, "Limits";
// docs/architecture.md §6): a limit several coordinator replicas enforce at
// once, kept in one record per owner in brood_agents and taken by
// compare-and-set. The coordinator composes two (a parent's live children,
// services/coordinator/slots.go; a user's open roots, openroots.go).
package slotrecord

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// A limit that several replicas enforce at once (a parent's live
// children, slots.go; a user's open roots, openroots.go) cannot rest on what
// each replica's caches count: two admissions served at the same instant
// both see the same count before either's lease exists. So each admission
// takes a slot in one record per owner (the parent, the user) in
// brood_agents, by compare-and-set: the admissions of one owner are
// serialized by the record's revision, whichever replica serves them.
//
// Records is that mechanism for one kind of record R, shared by both:
//   - this replica's admissions of one owner wait for each other (so they
//     do not race on the record) on a lock a waiter gives up at its
//     deadline: an admission stalled by an election must not make the ones
//     behind it answer after their callers stopped waiting;
//   - the record is read from the bucket's leader (a follower just elected,
//     or catching up after a restart, answers a revision already
//     superseded, and every compare-and-set from it would conflict), and
//     the record this replica last wrote is reused: only another replica's
//     write makes an admission read it again;
//   - a compare-and-set that conflicts reads again, at once when the
//     revision it wrote at was remembered (the owner's admissions alternate
//     between replicas, so a remembered one is often behind), after a short
//     random wait when it was read just now (another replica's admission of
//     the owner at the same time), at most AttemptsMax times;
//   - a failed admission's slot is given back within what is left of its
//     caller's deadline, then in the background within store.SettleBudget
//     (an election outlasting the caller); a slot left behind still lapses
//     after its grace (Grace). A release neither waits for the owner's
//     admissions nor they for it: it reads the record from the leader and
//     writes it by compare-and-set, and an admission whose remembered
//     revision it superseded reads it again.
type Records[R any] struct {
	// Read reads owner's record from the bucket's leader (none:
	// store.ErrNotFound); Write writes it by compare-and-set at rev (0:
	// create).
	Read  func(ctx context.Context, owner string) (store.Record[R], error)
	Write func(ctx context.Context, owner string, rec R, rev uint64) (uint64, error)
	// Words of its errors and logs: a slot ("live-child slot"), the records
	// ("live children"), the admissions ("admissions"), and owner's name
	// ("<parent>", "user <user>").
	Slot, Records, Admissions string
	Of                        func(owner string) string
	// Backoff is the random wait after a conflict on a record read just now
	// (Coordinator.slotBackoff); Background runs a release past its
	// caller's deadline (Coordinator.background); Grace is how long a slot
	// left behind is counted (the coordinator's slotGrace).
	Backoff    func() time.Duration
	Background func(func(context.Context))
	Grace      func() time.Duration
	Log        *slog.Logger

	mu sync.Mutex
	m  map[string]*ownerSlots[R] // at most OwnersCachedMax
}

// OwnersCachedMax bounds the owners whose slot record a replica keeps.
const OwnersCachedMax = 10000

// AttemptsMax bounds the compare-and-set attempts of one admission.
const AttemptsMax = 32

// BackoffMax bounds the random wait before a conflicting admission
// tries again, so two replicas' admissions of one owner interleave.
const BackoffMax = 20 * time.Millisecond

// ownerSlots is what this replica last knew of one owner's slot record. Its
// admissions hold held while they use it.
type ownerSlots[R any] struct {
	held  chan struct{} // capacity 1: full while an admission holds it
	rec   R
	rev   uint64
	known bool
}

// lock takes o for an admission, or returns ctx's error once ctx is done.
func (o *ownerSlots[R]) lock(ctx context.Context) error {
	select {
	case o.held <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (o *ownerSlots[R]) unlock() { <-o.held }

func (sr *Records[R]) owner(owner string) *ownerSlots[R] {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	if sr.m == nil || len(sr.m) >= OwnersCachedMax {
		sr.m = map[string]*ownerSlots[R]{} // dropping an entry only costs a read
	}
	o := sr.m[owner]
	if o == nil {
		o = &ownerSlots[R]{held: make(chan struct{}, 1)}
		sr.m[owner] = o
	}
	return o
}

// Reserve takes a slot of owner's record: take is given the record as
// known (the zero R when there is none) and the time of the attempt, and
// returns the record to write (the slot taken, lapsed ones dropped), or an
// error: a *protocol.Error (LIMIT_EXCEEDED) is the answer as it is, any
// other a read that failed (UNAVAILABLE). take must not change the record
// it is given. Every read and write waits out a leader election within ctx
// (the caller's deadline, less the margin to answer): an UNAVAILABLE says
// how long the admission took, and how much of it went to waiting for this
// replica's other admissions of the owner.
func (sr *Records[R]) Reserve(ctx context.Context, owner string, take func(ctx context.Context, rec R, now int64) (R, error)) error {
	began := time.Now()
	o := sr.owner(owner)
	err := o.lock(ctx)
	waited := time.Since(began)
	of := sr.Of(owner)
	unavailable := func(what string, err error) error {
		return protocol.Errorf(protocol.CodeUnavailable, "%s of %s after %s (%s of it waiting for this replica's other %s of %s): %w",
			what, of, time.Since(began).Round(time.Millisecond), waited.Round(time.Millisecond), sr.Admissions, of, err)
	}
	reserve := "reserve a " + sr.Slot
	if err != nil {
		return unavailable(reserve, err)
	}
	defer o.unlock()
	for attempt := 0; attempt < AttemptsMax; attempt++ {
		cached := o.known
		if !o.known {
			cur, err := sr.Read(ctx, owner)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return unavailable("read the "+sr.Records, err)
			}
			o.rec, o.rev, o.known = cur.Value, cur.Revision, true
		}
		next, err := take(ctx, o.rec, store.NowMs())
		if err != nil {
			var pe *protocol.Error
			if errors.As(err, &pe) {
				return err
			}
			return unavailable("read the "+sr.Records, err)
		}
		rev, err := sr.Write(ctx, owner, next, o.rev)
		if err == nil {
			o.rec, o.rev = next, rev
			return nil
		}
		o.known = false // another replica wrote, or the write's outcome is unknown: read again
		if !errors.Is(err, store.ErrConflict) {
			return unavailable(reserve, err)
		}
		if cached {
			continue
		}
		select {
		case <-ctx.Done():
			return unavailable(reserve, ctx.Err())
		case <-time.After(sr.Backoff()):
		}
	}
	return protocol.Errorf(protocol.CodeUnavailable, "the %s of %s kept changing; retry", sr.Records, of)
}

// Release gives back a slot of owner's record after its admission failed:
// drop returns the record without it, and false when it holds no such slot.
// It writes within what is left of ctx, then, when that did not do, in the
// background within store.SettleBudget; a slot left behind lapses after
// its grace (logged).
func (sr *Records[R]) Release(ctx context.Context, owner string, drop func(R) (R, bool)) {
	if sr.drop(ctx, owner, drop) == nil {
		return
	}
	sr.Background(func(bg context.Context) {
		ctx, cancel := context.WithTimeout(bg, store.SettleBudget)
		defer cancel()
		if err := sr.drop(ctx, owner, drop); err != nil {
			sr.Log.Warn("a failed admission's slot not released; it lapses after its grace", "slot", sr.Slot, "of", sr.Of(owner), "grace", sr.Grace(), "err", err)
		}
	})
}

// drop removes a slot from owner's record (read from the leader, written by
// compare-and-set); a record without it is no error.
func (sr *Records[R]) drop(ctx context.Context, owner string, drop func(R) (R, bool)) error {
	for attempt := 0; attempt < AttemptsMax; attempt++ {
		cur, err := sr.Read(ctx, owner)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		next, had := drop(cur.Value)
		if !had {
			return nil
		}
		if _, err = sr.Write(ctx, owner, next, cur.Revision); !errors.Is(err, store.ErrConflict) {
			return err
		}
	}
	return fmt.Errorf("the %s of %s kept changing", sr.Records, sr.Of(owner))
}
