package worker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// A fork child's seed is read through the coordinators page by page, and a
// page answered UNAVAILABLE (no coordinator answered in time, or one could
// not read the parent's log: an election) is asked for again within the
// start's budget, as the host's own store reads were: the start does not
// fail on an election (RELIABILITY.md, the seed after the claim).
func TestAForkSeedPageAnsweredUnavailableIsAskedAgain(t *testing.T) {
	s := testutil.Server(t)
	nc := testutil.Connect(t, s.ClientURL())
	st := testutil.Store(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seed := testutil.TurnHistory(t, 2, false)
	for i := range seed {
		seed[i].Seq = int64(i)
	}
	h := protocol.SessionHeader{ID: "C", ParentSession: "P", Provider: "fork", SeedLength: int64(len(seed))}
	var asked atomic.Int32
	srv := rpc.NewServer(nc, 4, testutil.Logger(t))
	t.Cleanup(func() { srv.Stop(context.Background()) })
	if err := srv.Subscribe(st.Subj.Read("fork", protocol.ReadForkSeed, "C"), "", nil, rpc.Typed(func(_ context.Context, _ rpc.Request, r protocol.ForkSeedRequest) (protocol.LogPage, error) {
		if asked.Add(1) <= 2 {
			return protocol.LogPage{}, protocol.Errorf(protocol.CodeUnavailable, "an election of the log's stream")
		}
		end := min(r.FromSeq+5, int64(len(seed)))
		return protocol.LogPage{Events: seed[r.FromSeq:end], NextSeq: end, Complete: end == int64(len(seed))}, nil
	})); err != nil {
		t.Fatal(err)
	}
	if err := rpc.Subscribed(nc, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p := &InProcess{Seeded: true, Store: st}
	got, err := p.readSeed(ctx, h)
	if err != nil || len(got) != len(seed) {
		t.Fatalf("the seed: %d events, %v; want %d", len(got), err, len(seed))
	}
	if n := asked.Load(); n != 5 {
		t.Fatalf("%d requests, want 2 refused and 3 pages", n)
	}
}
