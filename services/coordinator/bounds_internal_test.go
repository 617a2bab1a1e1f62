package coordinator

import (
	"fmt"
	"testing"
	"time"
)

// Bounds of the replica's per-user and per-host maps (BENCHMARKS.md,
// session 11): each drops what it no longer needs once it is full, or on
// every addition, so no map grows with every user or host ever seen.

// TestUserLimitersAreBounded: past userLimitersMax users, adding one drops
// the token buckets that are full (idle users: a new bucket is the same),
// and keeps a busy user's, so it gains no request. Before, the map kept a
// bucket for every user that ever sent a request.
func TestUserLimitersAreBounded(t *testing.T) {
	var q userQuotas
	busy := q.limiter("busy", 1, 10)
	for busy.Allow() {
	}
	for i := 1; i < userLimitersMax; i++ {
		q.limiter(fmt.Sprint("idle-", i), 1, 10)
	}
	if len(q.limiters) != userLimitersMax {
		t.Fatalf("%d buckets, want %d", len(q.limiters), userLimitersMax)
	}
	q.limiter("new", 1, 10)
	if len(q.limiters) != 2 || q.limiters["busy"] != busy || q.limiters["new"] == nil {
		t.Fatalf("%d buckets after the bound (busy kept: %v), want the busy user's and the new one", len(q.limiters), q.limiters["busy"] == busy)
	}
	if busy.Allow() {
		t.Fatal("the busy user's bucket was refilled")
	}
}

// TestSuspectsPastTheirTimeAreDropped: suspecting a host drops the
// suspects whose host expiry passed (a host no request asked for again, one
// that stopped). Before, they stayed for good.
func TestSuspectsPastTheirTimeAreDropped(t *testing.T) {
	c := &Coordinator{cfg: Config{HostExpiry: time.Minute}}
	c.suspected.m = map[string]time.Time{"gone": time.Now().Add(-time.Second), "recent": time.Now().Add(time.Second)}
	c.suspect("new")
	if len(c.suspected.m) != 2 || c.suspected.m["gone"] != (time.Time{}) {
		t.Fatalf("suspects %v, want recent and new", c.suspected.m)
	}
}
