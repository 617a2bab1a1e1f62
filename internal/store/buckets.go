package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/pkg/protocol"
)

// What a run's life needs of the buckets besides the writes (runs.go,
// leases.go, ...), named for what it does: the coordinator, the worker,
// the chaos checker and the test helpers call these, and no package
// outside this one holds a bucket handle (issue 31, item 3;
// TestNoBucketHandleOutsideTheStore).

// WatchHosts opens a watch of every key of brood_hosts: the current values,
// nil once they are in, then every change (jetstream.KeyValue.WatchAll;
// the opener of the coordinator's hosts watch, kvwatch.Watch).
func (s *Store) WatchHosts(ctx context.Context) (jetstream.KeyWatcher, error) {
	return s.Hosts.WatchAll(ctx)
}

// WatchAgents is WatchHosts of brood_agents.
func (s *Store) WatchAgents(ctx context.Context) (jetstream.KeyWatcher, error) {
	return s.Agents.WatchAll(ctx)
}

// WatchRuns is WatchHosts of brood_runs.
func (s *Store) WatchRuns(ctx context.Context) (jetstream.KeyWatcher, error) {
	return s.Runs.WatchAll(ctx)
}

// WatchRunState opens a watch of run id's state under provider
// (RunStateKey): its latest value, nil, then every change, until ctx ends
// or the watcher is stopped.
func (s *Store) WatchRunState(ctx context.Context, provider, id string) (jetstream.KeyWatcher, error) {
	return s.Runs.Watch(ctx, RunStateKey(provider, id))
}

// RunSpecLatest reads run id's spec under provider (RunSpecKey) from the
// leader of brood_runs (GetLatest: ErrNotFound when there is none),
// bypassing the spec cache: a spec this replica's watch may not have
// delivered yet.
func (s *Store) RunSpecLatest(ctx context.Context, provider, id string) (Record[protocol.RunRecord], error) {
	return GetLatest[protocol.RunRecord](ctx, s.Runs, RunSpecKey(provider, id))
}

// HostLatest reads host id's record (HostKey) from the leader of
// brood_hosts (GetLatest: ErrNotFound when there is none).
func (s *Store) HostLatest(ctx context.Context, id string) (Record[protocol.HostRecord], error) {
	return GetLatest[protocol.HostRecord](ctx, s.Hosts, HostKey(id))
}

// LeaderGet reads key of the bucket named bucket, brood_agents or
// brood_runs (protocol.Subjects.BucketAgents, BucketRuns: what a KVLatest
// subject names), as its stream's leader has it (the package's LeaderGet:
// see LeaderReadFunc). Another bucket's name is ErrNoLeaderReads.
func (s *Store) LeaderGet(ctx context.Context, bucket, key string) (data []byte, rev uint64, found bool, err error) {
	var kv jetstream.KeyValue
	switch bucket {
	case s.Subj.BucketAgents():
		kv = s.Agents
	case s.Subj.BucketRuns():
		kv = s.Runs
	}
	if kv == nil {
		return nil, 0, false, fmt.Errorf("%w: %q", ErrNoLeaderReads, bucket)
	}
	return LeaderGet(ctx, kv, key)
}

// ErrNoLeaderReads: a leader read (Store.LeaderGet) named a bucket other
// than brood_agents and brood_runs.
var ErrNoLeaderReads = errors.New("store: leader reads are of the agents and runs buckets only")

// CreateRunRecords writes rec as a run's spec and state in any state
// (RunSpecKey, RunStateKey of its provider), one after the other, and
// returns the state's revision: what a test that sets up a run a host or
// coordinator left behind needs (testutil.PutRun). Services create runs
// with CreateRun, which creates them running and both records at once.
func (s *Store) CreateRunRecords(ctx context.Context, rec protocol.RunRecord) (uint64, error) {
	if _, err := Create(ctx, s.Runs, RunSpecKey(rec.Provider, rec.RunID), rec); err != nil {
		return 0, err
	}
	return Create(ctx, s.Runs, RunStateKey(rec.Provider, rec.RunID), rec)
}

// EachRunsKey passes every live key of brood_runs and its value to f, as
// a watch's initial values deliver them (a snapshot read: the chaos
// checker's), and stops at f's first error, which it returns.
func (s *Store) EachRunsKey(ctx context.Context, f func(key string, v []byte) error) error {
	return eachKey(ctx, s.Runs, f)
}

// EachAgentsKey is EachRunsKey of brood_agents.
func (s *Store) EachAgentsKey(ctx context.Context, f func(key string, v []byte) error) error {
	return eachKey(ctx, s.Agents, f)
}

// eachKey passes every live key of kv and its value to f.
func eachKey(ctx context.Context, kv jetstream.KeyValue, f func(key string, v []byte) error) error {
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("watch %s: %w", kv.Bucket(), err)
	}
	defer w.Stop()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("watch %s closed", kv.Bucket())
			}
			if e == nil {
				return nil // the initial values are done
			}
			if err := f(e.Key(), e.Value()); err != nil {
				return err
			}
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", kv.Bucket(), ctx.Err())
		}
	}
}
