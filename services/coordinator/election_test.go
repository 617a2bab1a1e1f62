package coordinator_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// TestAnElectionIsWaitedOutByRunsStart: a runs.start whose coordinator's
// writes (the slot, the child's header, the run record) answer "no response
// from stream" for longer than the store's WriteBudget (a leader election
// on a loaded cluster) waits it out within its caller's deadline and starts
// the run: no step of the admission has a fixed budget of its own.
func TestAnElectionIsWaitedOutByRunsStart(t *testing.T) {
	s := stack.New(t)
	e := &testutil.Election{}
	s.AddCoordinator(func(c *coordinator.Config) { c.Store = c.Store.WithFaults(e.Faults()) })
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	root := s.Root()
	hosts := s.Store.Hosts.Bucket()
	e.Match(func(w store.Write) bool { return w.Bucket != hosts }) // its heartbeats go on
	ctx, cancel := context.WithTimeout(context.Background(), client.DefaultTimeout)
	defer cancel()
	began := time.Now()
	r, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("say ok")})
	if err != nil {
		t.Fatalf("runs.start through an election (after %s): %v", time.Since(began).Round(time.Millisecond), err)
	}
	e.Check(t)
	rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer rcancel()
	if res, err := r.Result(rctx); err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("the run's result: %+v %v", res, err)
	}
}

// TestAStartBehindAStalledAdmissionAnswersInTime: a replica's admissions of
// one parent wait for each other; one stalled by an election (its slot write
// refused "no response from stream" for testutil.ElectionLasts, within a budget of
// its own longer than the start's: a cold resume's) must not make a
// runs.start behind it answer after its caller stopped waiting. The start
// is answered UNAVAILABLE by the coordinator within its deadline, saying it
// waited for the other admission (before, it waited for the stalled one
// whatever its own deadline, and its client heard nothing).
func TestAStartBehindAStalledAdmissionAnswersInTime(t *testing.T) {
	s := stack.New(t)
	e := &testutil.Election{}
	c := s.AddCoordinator(func(c *coordinator.Config) { c.Store = c.Store.WithFaults(e.Faults()) })
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	root := s.Root()
	e.Match(func(w store.Write) bool { return w.Key == store.SlotsKey(root.SessionID) })
	hctx, hcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer hcancel()
	held := make(chan error, 1)
	go func() { held <- c.ReserveChild(hctx, root.SessionID, "stalled-admission") }()
	testutil.Eventually(t, 10*time.Second, func() bool { return e.Refusals() > 0 }, "the first admission's slot write is refused")
	const timeout = 5 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	began := time.Now()
	_, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("say ok")})
	took := time.Since(began)
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeUnavailable || !strings.Contains(err.Error(), "waiting for this replica's other admissions") {
		t.Fatalf("a start behind an admission stalled past its deadline (%s): %v after %s; want the coordinator's UNAVAILABLE within the deadline, naming the wait", timeout, err, took.Round(time.Millisecond))
	}
	if err := <-held; err != nil {
		t.Fatalf("the stalled admission, once the election ended: %v", err)
	}
	e.Check(t)
}

// TestAFailedStartsSlotIsReleasedThroughAnElection: a start that took its
// slot and then failed (its run record refused) gives the slot back even
// when the slot record's bucket is electing a leader for longer than the
// store's WriteBudget: the release waits within what is left of the
// caller's deadline, then goes on in the background within
// store.SettleBudget (before: it had a fixed WriteBudget, gave up, and the
// slot stayed in the record).
func TestAFailedStartsSlotIsReleasedThroughAnElection(t *testing.T) {
	s := stack.New(t)
	e := &testutil.Election{}
	var slotWrites atomic.Int64
	refused := errors.New("refused for the test")
	var runs string
	s.AddCoordinator(func(c *coordinator.Config) {
		f := e.Faults()
		c.Store = c.Store.WithFaults(store.Faults{Before: func(ctx context.Context, w store.Write) error {
			if w.Bucket == runs && w.Op == store.OpKVCreate {
				return refused // the run record: not transient, the start fails
			}
			return f.Before(ctx, w)
		}})
	})
	runs = s.Store.Runs.Bucket()
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	root := s.Root()
	key := store.SlotsKey(root.SessionID)
	// The reservation lands; every slot write after it (the release) is
	// refused for testutil.ElectionLasts.
	e.Match(func(w store.Write) bool { return w.Key == key && slotWrites.Add(1) > 1 })
	// The caller's deadline ends before the election does.
	ctx, cancel := context.WithTimeout(context.Background(), testutil.ElectionLasts*2/3)
	defer cancel()
	_, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("say ok")})
	if protocol.CodeOf(err) != protocol.CodeUnavailable || !strings.Contains(err.Error(), "record the run") {
		t.Fatalf("a start whose run record is refused: %v; want UNAVAILABLE (record the run)", err)
	}
	testutil.Eventually(t, 2*testutil.ElectionLasts, func() bool { return len(slotsOf(t, s, root.SessionID)) == 0 }, "the failed start's slot is released once the election ends")
	e.Check(t)
}

// TestAStartMeetsTwoElectionsOfItsParentsBucketOnce: a start's two reads
// and writes on brood_agents that do not depend on each other, the
// parent's lease read from the leader and the slot's compare-and-set, wait
// out elections side by side (issue 16: back to back, one election each
// cost a start twice, and three in a row ran out its deadline). Each is
// held for electionHeld, once; a start with a deadline shorter than both
// held in series, longer than one, completes. It failed before (the steps
// in series: UNAVAILABLE after the deadline).
func TestAStartMeetsTwoElectionsOfItsParentsBucketOnce(t *testing.T) {
	const electionHeld, timeout = 3 * time.Second, 5 * time.Second
	s := stack.New(t)
	var rootID atomic.Value
	rootID.Store("")
	// Each election answers "no response from stream" from its first
	// refusal on, for electionHeld.
	var leaseHeld, slotHeld atomic.Int64 // the first refusal (unix ns); 0: none yet
	hold := func(began *atomic.Int64) error {
		now := time.Now().UnixNano()
		began.CompareAndSwap(0, now)
		if time.Duration(now-began.Load()) < electionHeld {
			return jetstream.ErrNoStreamResponse
		}
		return nil
	}
	s.AddCoordinator(func(c *coordinator.Config) {
		c.Store = c.Store.WithFaults(store.Faults{
			LeaderRead: func(_ context.Context, _, key string) error {
				if id := rootID.Load().(string); id != "" && key == store.RootLeaseKey(id) {
					return hold(&leaseHeld)
				}
				return nil
			},
			Before: func(_ context.Context, w store.Write) error {
				if id := rootID.Load().(string); id != "" && w.Key == store.SlotsKey(id) {
					return hold(&slotHeld)
				}
				return nil
			},
		})
	})
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	root := s.Root()
	rootID.Store(root.SessionID)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	began := time.Now()
	run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("say ok")})
	took := time.Since(began)
	if err != nil {
		t.Fatalf("a start whose parent's lease read and slot write each waited %s, with a deadline of %s: %v after %s; want it started", electionHeld, timeout, err, took.Round(time.Millisecond))
	}
	if leaseHeld.Load() == 0 || slotHeld.Load() == 0 || took < electionHeld {
		t.Fatalf("the parent's lease read refused: %v, the slot write: %v, the start took %s; want both refused for %s", leaseHeld.Load() != 0, slotHeld.Load() != 0, took, electionHeld)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	if res, err := run.Result(rctx); err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("result: %+v, %v", res, err)
	}
}
