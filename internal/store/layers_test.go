package store

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/pkg/protocol"
)

// plainLayer is a wrapper of a bucket, as a new one would be written: it
// has unwrap (kvWrapper) and none of the store's own methods of a bucket
// (no updateTTL, no leaderGet).
type plainLayer struct{ jetstream.KeyValue }

func (p plainLayer) unwrap() jetstream.KeyValue { return p.KeyValue }

// TestATTLdWriteReachesTheBucketThroughAnyWrapper: a settlement (UpdateTTL)
// through a wrapper that does not pass updateTTL on by hand (plainLayer)
// reaches the bucket under it with its TTL, wherever the wrapper sits among
// the store's own: over the bucket, over or under the fault seam (which
// still sees the write, as an OpKVUpdate with Write.TTL set), under the
// leader-read wrapper. Before, a wrapper without updateTTL failed every
// settlement through it ("the bucket is not a store's"), as leaderVia did
// before it was given a copy.
func TestATTLdWriteReachesTheBucketThroughAnyWrapper(t *testing.T) {
	st := provisioned(t, "layers")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var mu sync.Mutex
	var seen []Write
	faults := Faults{Before: func(_ context.Context, w Write) error {
		if w.Bucket == st.Runs.Bucket() {
			mu.Lock()
			seen = append(seen, w)
			mu.Unlock()
		}
		return nil
	}}
	plain := func(s *Store) *Store {
		c := *s
		c.Runs = plainLayer{c.Runs}
		return &c
	}
	leaderReads := func(s *Store) *Store {
		return s.WithLeaderReads([]string{"spawn"}, func(ctx context.Context, _, key string) ([]byte, uint64, bool, error) {
			return LeaderGet(ctx, st.Runs, key)
		})
	}
	cases := []struct {
		name string
		wrap func(*Store) *Store
		seam bool // the fault seam is among the layers: it sees the write
	}{
		{"over the bucket", plain, false},
		{"over the fault seam", func(s *Store) *Store { return plain(s.WithFaults(faults)) }, true},
		{"under the fault seam", func(s *Store) *Store { return plain(s).WithFaults(faults) }, true},
		{"under the leader reads, over the seam", func(s *Store) *Store { return leaderReads(plain(s.WithFaults(faults))) }, true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mu.Lock()
			seen = nil
			mu.Unlock()
			rec := protocol.RunRecord{RunID: fmt.Sprintf("R%d", i), ChildID: "C", ParentSession: "P", Provider: "spawn",
				Mode: protocol.ModeOneShot, State: protocol.RunRunning, CreatedAt: 1}
			rev, err := st.CreateRun(ctx, rec)
			if err != nil {
				t.Fatal(err)
			}
			won, err := c.wrap(st).SettleRun(ctx, Settled(rec, "spawn.H1", protocol.SubagentResult{StopReason: protocol.StopCompleted}), rev)
			if err != nil || !won {
				t.Fatalf("a settlement through the wrappers: won %v, %v", won, err)
			}
			key := RunStateKey(rec.Provider, rec.RunID)
			m, err := st.leaderLast(ctx, kvStreamPrefix+st.Runs.Bucket(), "$KV."+st.Runs.Bucket()+"."+key)
			var got protocol.RunRecord
			if err != nil || m.Sequence <= rev || protocol.Unmarshal(protocol.Msgpack, m.Data, &got) != nil || got.State != protocol.RunSettled {
				t.Fatalf("the state after the settlement: %+v, %v; want it settled after revision %d", m, err, rev)
			}
			if ttl := m.Header.Get(jetstream.MsgTTLHeader); ttl == "" {
				t.Fatalf("the settled state was written without a TTL (headers %v)", m.Header)
			}
			mu.Lock()
			defer mu.Unlock()
			if !c.seam {
				return
			}
			if len(seen) != 1 || seen[0].Op != OpKVUpdate || seen[0].Key != key || seen[0].Revision != rev || seen[0].TTL != st.RunsTTL() {
				t.Fatalf("the seam saw %+v; want one KV update of %s at revision %d with a TTL of %s", seen, key, rev, st.RunsTTL())
			}
		})
	}
}
