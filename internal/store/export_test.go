package store

import (
	"context"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"
)

// StaleReads is writes whose first n reads from the leader (the reads that
// decide a refused compare-and-set) find no message for the key at all, as
// a leader that has not applied it answers; later ones read leader.
func StaleReads(writes, leader jetstream.KeyValue, n int32) jetstream.KeyValue {
	s := &staleReads{KeyValue: writes, leader: leader}
	s.left.Store(n)
	return s
}

type staleReads struct {
	jetstream.KeyValue
	leader jetstream.KeyValue
	left   atomic.Int32
}

func (s *staleReads) leaderGet(ctx context.Context, key string) ([]byte, uint64, bool, error) {
	if s.left.Add(-1) >= 0 {
		return nil, 0, false, nil
	}
	return latest(ctx, s.leader, key)
}

func (s *staleReads) unwrap() jetstream.KeyValue { return s.KeyValue }
