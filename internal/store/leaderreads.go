package store

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Leader reads by a worker (docs/security.md, "What comes next", item 3).
// A read from a bucket stream's leader ($JS.API.STREAM.MSG.GET) names its
// key in the request's body, so a NATS permission that allows it allows
// every key of the bucket. A worker's store therefore asks the coordinators
// for the leader's answer (protocol.Subjects.KVLatest), and they answer
// only keys under the asking provider's prefixes: no worker needs a
// leader get of brood_agents or brood_runs. These reads are off the happy
// path of a run (a refused compare-and-set's check, a claim that lost, a
// lease check after a heartbeat gap, whether a parent may settle), so the
// extra hop costs little where it is paid (BENCHMARKS.md).

// LeaderReadFunc reads key of bucket (its name) as the bucket stream's
// leader has it: its value and revision, found false when it was never
// written (revision 0) or is deleted (revision the delete marker's).
type LeaderReadFunc func(ctx context.Context, bucket, key string) (data []byte, rev uint64, found bool, err error)

// WithLeaderReads returns a copy of s whose reads from the leader of
// brood_agents and brood_runs (GetLatest, LeaseLatest, RunLatestOf,
// OwnershipLatestOf, every refused compare-and-set's check) of a key of
// one of scopes (ScopeOfKey) go through read; reads of other keys go to
// the leader as before. s is unchanged; both share the connection. An
// UNAVAILABLE answer (no coordinator, or its read failed) is transient:
// the read is tried again within its caller's budget.
func (s *Store) WithLeaderReads(scopes []string, read LeaderReadFunc) *Store {
	c := *s
	for _, kv := range []*jetstream.KeyValue{&c.Agents, &c.Runs} {
		if *kv != nil {
			*kv = leaderVia{KeyValue: *kv, scopes: slices.Clone(scopes), read: read, hook: c.leaderRead}
		}
	}
	return &c
}

// leaderVia is a bucket whose leader reads of its scopes' keys go through
// read (WithLeaderReads).
type leaderVia struct {
	jetstream.KeyValue
	scopes []string
	read   LeaderReadFunc
	hook   func(ctx context.Context, bucket, key string) error // Faults.LeaderRead
}

func (kv leaderVia) leaderGet(ctx context.Context, key string) ([]byte, uint64, bool, error) {
	scope, ok := ScopeOfKey(key)
	if !ok || !slices.Contains(kv.scopes, scope) {
		return latest(ctx, kv.KeyValue, key)
	}
	if kv.hook != nil {
		if err := kv.hook(ctx, kv.Bucket(), key); err != nil {
			return nil, 0, false, err
		}
	}
	data, rev, found, err := kv.read(ctx, kv.Bucket(), key)
	var pe *protocol.Error
	if errors.As(err, &pe) && pe.Code == protocol.CodeUnavailable {
		return nil, 0, false, fmt.Errorf("%w: %w", errBusy, err)
	}
	return data, rev, found, err
}

// unwrap returns the bucket whose leader reads this one routes (kvWrapper):
// its writes, a compare-and-set with a TTL (UpdateTTL) too, go there.
func (kv leaderVia) unwrap() jetstream.KeyValue { return kv.KeyValue }

// LeaderGet reads key of kv as the bucket stream's leader has it (the
// answer of a KVLatest request: see LeaderReadFunc), retrying transient
// failures within ctx's deadline, else WriteBudget.
func LeaderGet(ctx context.Context, kv jetstream.KeyValue, key string) (data []byte, rev uint64, found bool, err error) {
	err = Retry(ctx, func(ctx context.Context) (err error) {
		data, rev, found, err = latest(ctx, kv, key)
		return err
	})
	return data, rev, found, err
}
