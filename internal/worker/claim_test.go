package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
// answer was lost is reported as of unknown outcome, and reading it back
// finds the run this host's, at the record's revision, so the host carries
// it out. Before, the host answered UNAVAILABLE and forgot the run while the
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
	rev, err := store.Create(ctx, st.Runs, "R", rec)
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
	latest, err := store.GetLatest[protocol.RunRecord](ctx, st.Runs, "R")
	if err != nil || latest.Value.HostID != h.id {
		t.Fatalf("the claim did not land: %+v, %v", latest.Value, err)
	}
	var gotRev uint64
	var got protocol.RunRecord
	h.resolveClaim(claimed, err, func(run protocol.RunRecord, rev uint64) { got, gotRev = run, rev })
	if gotRev != latest.Revision || got.HostID != h.id || got.State != protocol.RunRunning {
		t.Fatalf("resolveClaim found %+v at revision %d; the record is at %d", got, gotRev, latest.Revision)
	}
}
