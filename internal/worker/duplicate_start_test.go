package worker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestAStartDeliveredTwiceToOneHostRunsOnce (issue 37, item 9): a start
// whose claim's answer was lost (a leader election of brood_runs) is
// answered UNAVAILABLE and decided in the background (claimLanded); the
// coordinator's dispatch, told UNAVAILABLE, tries the instances again
// (dispatch.go), this same host among them, so a second handler of the same
// run starts on it. Its claim fails (the first landed), but the lease it
// created beside that claim may land first, naming this host and this run.
// The claim decides which handler's run it is: the first handler replaces
// that lease as it replaces another instance's, and the run completes.
// Before, replaceLease refused a lease naming this host as another party's:
// the live host settled its own claimed run never started, NOT_PENDING,
// "another party held the session's lease before this host did (the run
// was settled as orphaned)" (deploy TestLeaderElectionsAreNotFailures under
// load, read then as an orphan settlement of a live host's run).
func TestAStartDeliveredTwiceToOneHostRunsOnce(t *testing.T) {
	h, st, _ := testHost(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	leaseKey := store.LeaseKey("spawn", "C1")
	var (
		loseClaims                    atomic.Bool // the claim's answers are lost
		creates                       atomic.Int32
		firstHeld                     = make(chan struct{}) // the first handler's lease create waits
		secondLanded                  = make(chan struct{}) // the second handler's lease create landed
		decided                       = make(chan struct{}) // the lease was replaced, or the run settled
		closeFirst, closeSecond, once sync.Once
	)
	loseClaims.Store(true)
	h.st = st.WithFaults(store.Faults{
		Before: func(wctx context.Context, w store.Write) error {
			switch {
			case w.Op == store.OpKVCreate && w.Key == leaseKey:
				if creates.Add(1) == 1 {
					closeFirst.Do(func() { close(firstHeld) })
					select {
					case <-secondLanded:
					case <-wctx.Done():
						return wctx.Err()
					}
				}
			case w.Op == store.OpKVDelete && w.Key == leaseKey:
				// The second handler drops its lease only once the first
				// decided what to do with it (replaced it, or gave up the
				// run): the drop cannot hide the conflict.
				select {
				case <-decided:
				case <-wctx.Done():
					return wctx.Err()
				}
			}
			return nil
		},
		After: func(_ context.Context, w store.Write, err error) error {
			switch {
			case w.Op == store.OpKVCreate && w.Key == leaseKey && err == nil && creates.Load() >= 2:
				closeSecond.Do(func() { close(secondLanded) })
			case w.Op == store.OpKVUpdate && w.Key == leaseKey && err == nil:
				once.Do(func() { close(decided) })
			case w.Op == store.OpKVUpdate && w.Key == store.RunStateKey("spawn", "C1"):
				var rec protocol.RunRecord
				if protocol.Unmarshal(protocol.Msgpack, w.Value, &rec) == nil && rec.State == protocol.RunSettled && err == nil {
					once.Do(func() { close(decided) })
				}
				if loseClaims.Load() && rec.State == protocol.RunRunning {
					return context.DeadlineExceeded // landed, its answer lost
				}
			}
			return err
		},
		LeaderRead: func(context.Context, string, string) error {
			if loseClaims.Load() {
				return errors.New("the leader is being elected")
			}
			return nil
		},
	})
	req := startRequest(t, st, "C1", "say ok", "")
	first := req
	first.Deadline = time.Now().Add(time.Second).UnixMilli()
	if _, err := h.startRun(ctx, h.cfg.Providers[0], first); protocol.CodeOf(err) != protocol.CodeUnavailable {
		t.Fatalf("the first start: %v, want UNAVAILABLE (its claim's outcome unknown)", err)
	}
	loseClaims.Store(false)
	if run, err := st.RunLatest(ctx, "C1"); err != nil || run.Value.HostID != h.id {
		t.Fatalf("the first claim did not land: %+v, %v", run.Value, err)
	}
	select {
	case <-firstHeld:
	case <-ctx.Done():
		t.Fatal("the first handler never created its lease")
	}
	second := req
	second.Deadline = time.Now().Add(time.Minute).UnixMilli()
	if _, err := h.startRun(ctx, h.cfg.Providers[0], second); protocol.CodeOf(err) != protocol.CodeNotPending {
		t.Fatalf("the same start again: %v, want NOT_PENDING (the first claim landed)", err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool {
		run, err := st.RunLatest(ctx, "C1")
		return err == nil && run.Value.State == protocol.RunSettled
	}, "the run settled")
	run, err := st.RunLatest(ctx, "C1")
	if err != nil {
		t.Fatal(err)
	}
	if v := run.Value; v.NotStarted || v.HostID != h.id || v.Result == nil || v.Result.StopReason != protocol.StopCompleted || protocol.PlainText(v.Result.Output) != "ok" {
		t.Fatalf("run record %+v (result %+v); want it completed by this host, not settled never started", v, v.Result)
	}
	waitRunDone(t, h)
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, err := st.Lease(ctx, "C1")
		return errors.Is(err, store.ErrNotFound)
	}, "the lease of the settled run released")
}
