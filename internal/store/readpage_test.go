package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestReadLogPageWaitsForTheLogStream: a page of a session's log read while
// the log stream answers nothing ("no responders": no leader, as through an
// election, or gone and being made again) is read again within its budget,
// not returned as an error: a followup's cold resume reads the head of the
// child's log this way, and was refused UNAVAILABLE "read the log of …:
// context deadline exceeded" while the other reads around it were retried
// (TestLeaderElectionsAreNotFailures).
func TestReadLogPageWaitsForTheLogStream(t *testing.T) {
	s := testutil.Server(t)
	nc := testutil.Connect(t, s.ClientURL())
	st := testutil.Store(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := st.JS.DeleteStream(ctx, st.Subj.StreamLog()); err != nil {
		t.Fatalf("delete %s: %v", st.Subj.StreamLog(), err)
	}
	back := make(chan error, 1)
	time.AfterFunc(time.Second, func() { // the stream is back, with one record
		pctx, pcancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer pcancel()
		again, err := store.Provision(pctx, nc, st.Subj, store.DefaultConfig())
		if err == nil {
			_, err = again.NewLogWriter(protocol.ScopeRoot, "P", 0, 0).Append(pctx, event(t, 1))
		}
		back <- err
	})
	began := time.Now()
	page, err := st.ReadLogPage(ctx, protocol.ScopeRoot, "P", 0, 0, 10, protocol.ReadPageBytesMax)
	if err != nil {
		t.Fatalf("page read while the log stream was away: %v", err)
	}
	if took := time.Since(began); took < time.Second {
		t.Fatalf("page read answered %+v after %s, before the stream was back", page, took)
	}
	if err := <-back; err != nil {
		t.Fatalf("make the stream again: %v", err)
	}
	// Back with nothing yet (before the append) or with the record.
	if len(page.Events) > 1 || !page.Complete {
		t.Fatalf("page = %+v, want complete with at most the one event", page)
	}
	if page, err := st.ReadLogPage(ctx, protocol.ScopeRoot, "P", 0, 0, 10, protocol.ReadPageBytesMax); err != nil || len(page.Events) != 1 {
		t.Fatalf("page once the stream is back = %+v, %v; want its one event", page, err)
	}
}
