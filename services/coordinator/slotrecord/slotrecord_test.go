package slotrecord

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// kv is an in-memory bucket of slot records: a list of slot names per
// owner at a revision, written by compare-and-set as brood_agents is.
type kv struct {
	mu     sync.Mutex
	recs   map[string]store.Record[[]string]
	rev    uint64
	reads  int
	writes int
	// before runs before each write (another replica writing first).
	before func(owner string)
}

func (k *kv) read(_ context.Context, owner string) (store.Record[[]string], error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.reads++
	r, ok := k.recs[owner]
	if !ok {
		return r, store.ErrNotFound
	}
	return r, nil
}

func (k *kv) write(_ context.Context, owner string, rec []string, rev uint64) (uint64, error) {
	if k.before != nil {
		k.before(owner)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.writes++
	if k.recs[owner].Revision != rev {
		return 0, store.ErrConflict
	}
	k.rev++
	k.recs[owner] = store.Record[[]string]{Value: slices.Clone(rec), Revision: k.rev}
	return k.rev, nil
}

// put writes owner's record as another replica would.
func (k *kv) put(owner string, rec []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.rev++
	k.recs[owner] = store.Record[[]string]{Value: rec, Revision: k.rev}
}

func newRecords(k *kv) *Records[[]string] {
	return &Records[[]string]{
		Read: k.read, Write: k.write,
		Slot: "slot", Records: "slots", Admissions: "admissions",
		Of:         func(owner string) string { return owner },
		Backoff:    func() time.Duration { return 0 },
		Background: func(f func(context.Context)) { f(context.Background()) },
		Grace:      func() time.Duration { return time.Minute },
		Log:        slog.New(slog.DiscardHandler),
	}
}

// takeUpTo takes slot id unless the record holds max slots already
// (LIMIT_EXCEEDED).
func takeUpTo(max int, id string) func(context.Context, []string, int64) ([]string, error) {
	return func(_ context.Context, rec []string, _ int64) ([]string, error) {
		if len(rec) >= max {
			return nil, protocol.NewError(protocol.CodeLimitExceeded, map[string]any{"limit": "slots", "reason": "full"})
		}
		return append(slices.Clone(rec), id), nil
	}
}

func without(id string) func([]string) ([]string, bool) {
	return func(rec []string) ([]string, bool) {
		i := slices.Index(rec, id)
		if i < 0 {
			return rec, false
		}
		return slices.Delete(slices.Clone(rec), i, i+1), true
	}
}

// TestReserveTakesSlotsByCompareAndSet: slots are taken in one record per
// owner up to what take allows (its refusal is the answer as it is), a
// record this replica wrote last is reused without a read, another
// replica's write makes it read again and retry, and a record that keeps
// changing is UNAVAILABLE after AttemptsMax compare-and-sets.
func TestReserveTakesSlotsByCompareAndSet(t *testing.T) {
	tests := []struct {
		name       string
		run        func(t *testing.T, k *kv, sr *Records[[]string]) error
		wantCode   protocol.Code
		wantRec    []string
		wantReads  int
		wantWrites int
	}{
		{
			name: "two slots, one read",
			run: func(t *testing.T, k *kv, sr *Records[[]string]) error {
				if err := sr.Reserve(context.Background(), "p", takeUpTo(2, "a")); err != nil {
					t.Fatal(err)
				}
				return sr.Reserve(context.Background(), "p", takeUpTo(2, "b"))
			},
			wantRec: []string{"a", "b"}, wantReads: 1, wantWrites: 2,
		},
		{
			name: "full",
			run: func(t *testing.T, k *kv, sr *Records[[]string]) error {
				k.put("p", []string{"x", "y"})
				return sr.Reserve(context.Background(), "p", takeUpTo(2, "a"))
			},
			wantCode: protocol.CodeLimitExceeded, wantRec: []string{"x", "y"}, wantReads: 1,
		},
		{
			name: "another replica wrote meanwhile",
			run: func(t *testing.T, k *kv, sr *Records[[]string]) error {
				if err := sr.Reserve(context.Background(), "p", takeUpTo(3, "a")); err != nil {
					t.Fatal(err)
				}
				k.put("p", []string{"a", "x"})
				return sr.Reserve(context.Background(), "p", takeUpTo(3, "b"))
			},
			wantRec: []string{"a", "x", "b"}, wantReads: 2, wantWrites: 3,
		},
		{
			name: "the record keeps changing",
			run: func(t *testing.T, k *kv, sr *Records[[]string]) error {
				n := 0
				k.before = func(owner string) { n++; k.put(owner, []string{fmt.Sprint("x", n)}) }
				return sr.Reserve(context.Background(), "p", takeUpTo(100, "a"))
			},
			wantCode: protocol.CodeUnavailable, wantRec: []string{fmt.Sprint("x", AttemptsMax)}, wantReads: AttemptsMax, wantWrites: AttemptsMax,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := &kv{recs: map[string]store.Record[[]string]{}}
			err := tt.run(t, k, newRecords(k))
			if got := protocol.CodeOf(err); (err != nil || tt.wantCode != "") && got != tt.wantCode {
				t.Fatalf("err %v (code %q), want code %q", err, got, tt.wantCode)
			}
			if got := k.recs["p"].Value; !slices.Equal(got, tt.wantRec) {
				t.Fatalf("record %v, want %v", got, tt.wantRec)
			}
			if k.reads != tt.wantReads || k.writes != tt.wantWrites {
				t.Fatalf("%d reads and %d writes, want %d and %d", k.reads, k.writes, tt.wantReads, tt.wantWrites)
			}
		})
	}
}

// TestReleaseDropsTheSlotOrLeavesItToLapse: a failed admission's slot is
// dropped from the record read from the leader (a record without it is no
// error); a release that cannot write within its caller's deadline is tried
// again in the background, and one that still fails is left to lapse.
func TestReleaseDropsTheSlotOrLeavesItToLapse(t *testing.T) {
	k := &kv{recs: map[string]store.Record[[]string]{}}
	sr := newRecords(k)
	k.put("p", []string{"a", "b"})
	sr.Release(context.Background(), "p", without("a"))
	if got := k.recs["p"].Value; !slices.Equal(got, []string{"b"}) {
		t.Fatalf("after the release: %v, want [b]", got)
	}
	sr.Release(context.Background(), "p", without("gone"))
	if got := k.recs["p"].Value; !slices.Equal(got, []string{"b"}) {
		t.Fatalf("a release of a slot not there changed the record: %v", got)
	}
	var background int
	sr.Background = func(f func(context.Context)) { background++; f(context.Background()) }
	k.before = func(owner string) { k.put(owner, []string{"b", "c"}) } // every write conflicts
	sr.Release(context.Background(), "p", without("b"))
	if background != 1 {
		t.Fatalf("a release that kept conflicting went to the background %d times, want once", background)
	}
	if got := k.recs["p"].Value; !slices.Contains(got, "b") {
		t.Fatalf("record %v: the slot was dropped although every write conflicted", got)
	}
	if err := sr.drop(context.Background(), "none", without("a")); err != nil {
		t.Fatalf("dropping from an owner with no record: %v", err)
	}
}
