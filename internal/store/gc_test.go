package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
)

// TestACollectedMarkerLeavesNothingBehind: a closed-root marker is listed,
// deleted only at its revision, and its delete marker expires (a plain KV
// delete would stay in the bucket for good, one message per key).
func TestACollectedMarkerLeavesNothingBehind(t *testing.T) {
	st := testutil.NewStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prev := store.KVMarkerTTL
	store.KVMarkerTTL = time.Second
	t.Cleanup(func() { store.KVMarkerTTL = prev })

	if err := st.PutClosedRoot(ctx, "R1", 1234); err != nil {
		t.Fatal(err)
	}
	list, err := st.ClosedRoots(ctx, 10)
	if err != nil || len(list) != 1 || list[0].SessionID != "R1" || list[0].ClosedAt != 1234 {
		t.Fatalf("closed roots %+v, %v; want R1 closed at 1234", list, err)
	}
	if err := st.DeleteClosedRoot(ctx, "R1", list[0].Revision+1); err != nil {
		t.Fatal(err)
	}
	if l, _ := st.ClosedRoots(ctx, 10); len(l) != 1 {
		t.Fatalf("a delete at another revision removed the marker: %+v", l)
	}
	if err := st.DeleteClosedRoot(ctx, "R1", list[0].Revision); err != nil {
		t.Fatal(err)
	}
	if l, err := st.ClosedRoots(ctx, 10); err != nil || len(l) != 0 {
		t.Fatalf("closed roots after the delete: %+v, %v", l, err)
	}
	kv, err := st.JS.Stream(ctx, "KV_"+st.Subj.BucketAgents())
	if err != nil {
		t.Fatal(err)
	}
	subject := "$KV." + st.Subj.BucketAgents() + "." + store.ClosedRootKey("R1")
	testutil.Eventually(t, 20*time.Second, func() bool {
		_, err := kv.GetLastMsgForSubject(ctx, subject)
		return errors.Is(err, jetstream.ErrMsgNotFound)
	}, "the delete marker of %s expired", subject)
}
