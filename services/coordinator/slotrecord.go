package coordinator

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

// Slot records (docs/design.md §4, agent limits; RELIABILITY.md I8; docs/security.md,
// "Limits"). A limit that several replicas enforce at once (a parent's live
// children, slots.go; a user's open roots, openroots.go) cannot rest on what
// each replica's caches count: two admissions served at the same instant
// both see the same count before either's lease exists. So each admission
// takes a slot in one record per owner (the parent, the user) in
// brood_agents, by compare-and-set: the admissions of one owner are
// serialized by the record's revision, whichever replica serves them.
//
// slotRecords is that mechanism for one kind of record R, shared by both:
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
//     the owner at the same time), at most slotAttemptsMax times;
//   - a failed admission's slot is given back within what is left of its
//     caller's deadline, then in the background within store.SettleBudget
//     (an election outlasting the caller); a slot left behind still lapses
//     after its grace (slotGrace). A release neither waits for the owner's
//     admissions nor they for it: it reads the record from the leader and
//     writes it by compare-and-set, and an admission whose remembered
//     revision it superseded reads it again.
type slotRecords[R any] struct {
	// read reads owner's record from the bucket's leader (none:
	// store.ErrNotFound); write writes it by compare-and-set at rev (0:
	// create).
	read  func(ctx context.Context, owner string) (store.Record[R], error)
	write func(ctx context.Context, owner string, rec R, rev uint64) (uint64, error)
	// Words of its errors and logs: a slot ("live-child slot"), the records
	// ("live children"), the admissions ("admissions"), and owner's name
	// ("<parent>", "user <user>").
	slot, records, admissions string
	of                        func(owner string) string
	// backoff is the random wait after a conflict on a record read just now
	// (Coordinator.slotBackoff); background runs a release past its
	// caller's deadline (Coordinator.background); grace is slotGrace.
	backoff    func() time.Duration
	background func(func(context.Context))
	grace      func() time.Duration
	log        *slog.Logger

	mu sync.Mutex
	m  map[string]*ownerSlots[R] // at most slotOwnersCachedMax
}

// slotOwnersCachedMax bounds the owners whose slot record a replica keeps.
const slotOwnersCachedMax = 10000

// slotAttemptsMax bounds the compare-and-set attempts of one admission.
const slotAttemptsMax = 32

// slotBackoffMax bounds the random wait before a conflicting admission
// tries again, so two replicas' admissions of one owner interleave.
const slotBackoffMax = 20 * time.Millisecond

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

func (sr *slotRecords[R]) owner(owner string) *ownerSlots[R] {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	if sr.m == nil || len(sr.m) >= slotOwnersCachedMax {
		sr.m = map[string]*ownerSlots[R]{} // dropping an entry only costs a read
	}
	o := sr.m[owner]
	if o == nil {
		o = &ownerSlots[R]{held: make(chan struct{}, 1)}
		sr.m[owner] = o
	}
	return o
}

// reserve takes a slot of owner's record: take is given the record as
// known (the zero R when there is none) and the time of the attempt, and
// returns the record to write (the slot taken, lapsed ones dropped), or an
// error: a *protocol.Error (LIMIT_EXCEEDED) is the answer as it is, any
// other a read that failed (UNAVAILABLE). take must not change the record
// it is given. Every read and write waits out a leader election within ctx
// (the caller's deadline, less the margin to answer): an UNAVAILABLE says
// how long the admission took, and how much of it went to waiting for this
// replica's other admissions of the owner.
func (sr *slotRecords[R]) reserve(ctx context.Context, owner string, take func(ctx context.Context, rec R, now int64) (R, error)) error {
	began := time.Now()
	o := sr.owner(owner)
	err := o.lock(ctx)
	waited := time.Since(began)
	of := sr.of(owner)
	unavailable := func(what string, err error) error {
		return protocol.Errorf(protocol.CodeUnavailable, "%s of %s after %s (%s of it waiting for this replica's other %s of %s): %w",
			what, of, time.Since(began).Round(time.Millisecond), waited.Round(time.Millisecond), sr.admissions, of, err)
	}
	reserve := "reserve a " + sr.slot
	if err != nil {
		return unavailable(reserve, err)
	}
	defer o.unlock()
	for attempt := 0; attempt < slotAttemptsMax; attempt++ {
		cached := o.known
		if !o.known {
			cur, err := sr.read(ctx, owner)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return unavailable("read the "+sr.records, err)
			}
			o.rec, o.rev, o.known = cur.Value, cur.Revision, true
		}
		next, err := take(ctx, o.rec, store.NowMs())
		if err != nil {
			var pe *protocol.Error
			if errors.As(err, &pe) {
				return err
			}
			return unavailable("read the "+sr.records, err)
		}
		rev, err := sr.write(ctx, owner, next, o.rev)
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
		case <-time.After(sr.backoff()):
		}
	}
	return protocol.Errorf(protocol.CodeUnavailable, "the %s of %s kept changing; retry", sr.records, of)
}

// release gives back a slot of owner's record after its admission failed:
// drop returns the record without it, and false when it holds no such slot.
// It writes within what is left of ctx, then, when that did not do, in the
// background within store.SettleBudget; a slot left behind lapses after
// its grace (logged).
func (sr *slotRecords[R]) release(ctx context.Context, owner string, drop func(R) (R, bool)) {
	if sr.drop(ctx, owner, drop) == nil {
		return
	}
	sr.background(func(bg context.Context) {
		ctx, cancel := context.WithTimeout(bg, store.SettleBudget)
		defer cancel()
		if err := sr.drop(ctx, owner, drop); err != nil {
			sr.log.Warn("a failed admission's slot not released; it lapses after its grace", "slot", sr.slot, "of", sr.of(owner), "grace", sr.grace(), "err", err)
		}
	})
}

// drop removes a slot from owner's record (read from the leader, written by
// compare-and-set); a record without it is no error.
func (sr *slotRecords[R]) drop(ctx context.Context, owner string, drop func(R) (R, bool)) error {
	for attempt := 0; attempt < slotAttemptsMax; attempt++ {
		cur, err := sr.read(ctx, owner)
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
		if _, err = sr.write(ctx, owner, next, cur.Revision); !errors.Is(err, store.ErrConflict) {
			return err
		}
	}
	return fmt.Errorf("the %s of %s kept changing", sr.records, sr.of(owner))
}
