package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// lostAnswers is a bucket whose updates land but whose answers are lost
// (context.DeadlineExceeded, as when JetStream's answer comes after the
// deadline) while loseWrites is set.
type lostAnswers struct {
	jetstream.KeyValue
	loseWrites atomic.Bool
}

func (l *lostAnswers) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	n, err := l.KeyValue.Update(context.WithoutCancel(ctx), key, value, rev)
	if l.loseWrites.Load() {
		return 0, context.DeadlineExceeded
	}
	return n, err
}

// TestClaimWhoseAnswerWasLostIsCarriedOut: a claim that landed although its
// answer was lost is reported as of unknown outcome, and deciding it
// (claimLanded writes it again) finds the run this host's, at the record's
// revision, so the host carries it out. Before, the host answered UNAVAILABLE and forgot the run while the
// coordinator, finding the record claimed, answered the start as started:
// the run stayed running for good with no lease and an empty log (chaos
// seed 1 of make test).
func TestClaimWhoseAnswerWasLostIsCarriedOut(t *testing.T) {
	st := testutil.NewStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lossy := &lostAnswers{KeyValue: st.Runs}
	st.Runs = lossy
	h := &Host{id: "claiming-host", st: st, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	rec := protocol.RunRecord{RunID: "R", ChildID: "C", ParentSession: "P", Provider: "spawn",
		Mode: protocol.ModeOneShot, State: protocol.RunRunning, CreatedAt: store.NowMs()}
	rev, err := st.CreateRun(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	lossy.loseWrites.Store(true)
	cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
	claimed, _, err := h.claim(cctx, rec, rev, "C")
	ccancel()
	lossy.loseWrites.Store(false)
	if !errors.Is(err, errClaimUnknown) || protocol.CodeOf(err) != protocol.CodeUnavailable {
		t.Fatalf("claim = %v, want UNAVAILABLE of unknown outcome", err)
	}
	latest, err := st.RunLatest(ctx, "R")
	if err != nil || latest.Value.HostID != h.id {
		t.Fatalf("the claim did not land: %+v, %v", latest.Value, err)
	}
	var gotRev uint64
	var got protocol.RunRecord
	h.resolveClaim(claimed, rev, err, func(run protocol.RunRecord, rev uint64) { got, gotRev = run, rev })
	if gotRev != latest.Revision || got.HostID != h.id || got.State != protocol.RunRunning {
		t.Fatalf("resolveClaim found %+v at revision %d; the record is at %d", got, gotRev, latest.Revision)
	}
}

// inFlight is a bucket whose updates, while held, answer
// context.DeadlineExceeded at once and do not land yet: the first one is
// kept in flight (a proposal the leader has not applied) and lands on the
// bucket's next update, or on land; later ones are lost.
type inFlight struct {
	jetstream.KeyValue
	mu      sync.Mutex
	hold    bool
	pending func()
}

func (b *inFlight) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	b.mu.Lock()
	if b.hold {
		if b.pending == nil {
			b.pending = func() { _, _ = b.KeyValue.Update(context.Background(), key, value, rev) }
		}
		b.mu.Unlock()
		return 0, context.DeadlineExceeded
	}
	b.mu.Unlock()
	b.land()
	return b.KeyValue.Update(ctx, key, value, rev)
}

// land applies the write in flight, if any.
func (b *inFlight) land() {
	b.mu.Lock()
	p := b.pending
	b.pending = nil
	b.mu.Unlock()
	if p != nil {
		p()
	}
}

// drop loses the write in flight.
func (b *inFlight) drop() {
	b.mu.Lock()
	b.pending = nil
	b.mu.Unlock()
}

// TestClaimStillInFlightIsDecided: a claim whose answer ran out of time is
// decided by writing it again at the creation revision, not by reading it
// back. A read-back finds a claim still in flight missing; the host forgot
// the run, the claim landed afterwards, and the coordinator, finding the
// record claimed, answered the start as started: the run stayed running
// for good with no lease and an empty log, its claimer alive (chaos seed 1
// under make test's load, I5 and I6: "descendant ... never settled").
// Whatever the write in flight does, the host carries the run out exactly
// when the record ends up claimed by it.
func TestClaimStillInFlightIsDecided(t *testing.T) {
	st := testutil.NewStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	bucket := &inFlight{KeyValue: st.Runs}
	st.Runs = bucket
	h := &Host{id: "claiming-host", st: st, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, tc := range []struct {
		name string
		// meanwhile runs after the claim answered, before it is decided.
		meanwhile  func(t *testing.T, runID string, rev uint64)
		wantLanded bool
	}{
		{"lands after the read", func(*testing.T, string, uint64) {}, true},
		{"is lost", func(*testing.T, string, uint64) { bucket.drop() }, true},
		{"is fenced by the coordinator's settlement", func(t *testing.T, runID string, rev uint64) {
			bucket.drop()
			rec, err := st.RunLatest(ctx, runID)
			if err != nil {
				t.Fatal(err)
			}
			settled := store.NotStarted(rec.Value, "coordinator", protocol.Errorf(protocol.CodeUnavailable, "no instance answered"))
			coord := *st // the coordinator's store: not this host's bucket in flight
			coord.Runs = bucket.KeyValue
			if won, err := coord.SettleRun(ctx, settled, rev); err != nil || !won {
				t.Fatalf("settle = %v, %v", won, err)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runID := ulid.Make().String()
			rec := protocol.RunRecord{RunID: runID, ChildID: runID, ParentSession: "P", Provider: "spawn",
				Mode: protocol.ModeOneShot, State: protocol.RunRunning, CreatedAt: store.NowMs()}
			rev, err := st.CreateRun(ctx, rec)
			if err != nil {
				t.Fatal(err)
			}
			bucket.mu.Lock()
			bucket.hold = true
			bucket.mu.Unlock()
			cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
			claimed, _, err := h.claim(cctx, rec, rev, runID)
			ccancel()
			bucket.mu.Lock()
			bucket.hold = false
			bucket.mu.Unlock()
			if !errors.Is(err, errClaimUnknown) {
				t.Fatalf("claim = %v, want an unknown outcome", err)
			}
			tc.meanwhile(t, runID, rev)
			var landed bool
			var gotRev uint64
			h.resolveClaim(claimed, rev, err, func(_ protocol.RunRecord, rev uint64) { landed, gotRev = true, rev })
			bucket.land() // a write still in flight lands now, if it can
			latest, err := st.RunLatest(ctx, runID)
			if err != nil {
				t.Fatal(err)
			}
			ours := latest.Value.State == protocol.RunRunning && latest.Value.HostID == h.id
			if landed != ours || landed != tc.wantLanded {
				t.Fatalf("carried out = %v, want %v; the record ended %+v at revision %d (claimed by this host: %v)",
					landed, tc.wantLanded, latest.Value, latest.Revision, ours)
			}
			if landed && gotRev != latest.Revision {
				t.Fatalf("carried out at revision %d; the record is at %d", gotRev, latest.Revision)
			}
		})
	}
}
