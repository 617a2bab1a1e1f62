package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestHostRecordsWaitsForTheBucketsStream: a listing of brood_hosts while
// the bucket's stream answers nothing ("no responders": no leader yet, as on
// an R3 cluster just provisioned, or gone and being made again) is retried
// within its budget, not returned as an error: a worker host that lists the
// other hosts before it registers exited with "list hosts: nats: no
// responders available for request" at the start of
// TestLeaderElectionsAreNotFailures, and the deployment had one spawn
// instance less.
func TestHostRecordsWaitsForTheBucketsStream(t *testing.T) {
	s := testutil.Server(t)
	nc := testutil.Connect(t, s.ClientURL())
	st := testutil.Store(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := "KV_" + st.Subj.BucketHosts()
	if err := st.JS.DeleteStream(ctx, stream); err != nil {
		t.Fatalf("delete %s: %v", stream, err)
	}
	rec := protocol.HostRecord{HostID: "spawn.h1", Kind: protocol.HostWorker, Heartbeat: store.NowMs()}
	back := make(chan error, 1)
	time.AfterFunc(time.Second, func() { // the stream is back, with one record
		pctx, pcancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer pcancel()
		again, err := store.Provision(pctx, nc, st.Subj, store.DefaultConfig())
		if err == nil {
			_, err = again.PutHost(pctx, rec)
		}
		back <- err
	})
	began := time.Now()
	recs, err := st.HostRecords(ctx)
	if err != nil {
		t.Fatalf("listing while the hosts bucket's stream was away: %v", err)
	}
	if took := time.Since(began); took < time.Second {
		t.Fatalf("listing answered %+v after %s, before the stream was back", recs, took)
	}
	// Back with nothing yet (before the put) or with the record: either is
	// what the bucket held.
	if len(recs) > 1 || (len(recs) == 1 && recs[0].HostID != rec.HostID) {
		t.Fatalf("listing = %+v, want at most the record of %s", recs, rec.HostID)
	}
	if err := <-back; err != nil {
		t.Fatalf("make the bucket again: %v", err)
	}
	if recs, err := st.HostRecords(ctx); err != nil || len(recs) != 1 || recs[0].HostID != rec.HostID {
		t.Fatalf("listing once the stream is back = %+v, %v; want the record of %s", recs, err, rec.HostID)
	}
}
