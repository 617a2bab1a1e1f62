package coordinator_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// A worker's read from a bucket's leader (protocol.Subjects.KVLatest) is
// answered only for a key under the prefixes of the provider its subject
// names (lease, owns, spec, state of that provider): a leader get names
// its key in its body, so no NATS permission scopes it, and a deployment
// lets a provider's workers publish only under their own provider's
// subject (docs/security.md). Another provider's records, roots' leases,
// grants and keys of no layout are refused with nothing read; the answer
// tells a deleted key (the revision of its delete marker) from one never
// written.
func TestALeaderReadIsAnsweredOnlyForTheSubjectsProvidersKeys(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := s.Root()
	putChildOf(t, s, root, "spawn", "C")
	putChildOf(t, s, root, "fork", "F")
	testutil.PutRun(t, s.Store, protocol.RunRecord{RunID: "RS", ChildID: "C", ParentSession: root.SessionID, Provider: "spawn",
		Mode: protocol.ModeOneShot, State: protocol.RunRunning, CreatedAt: store.NowMs()})
	testutil.PutRun(t, s.Store, protocol.RunRecord{RunID: "RF", ChildID: "F", ParentSession: root.SessionID, Provider: "fork",
		Mode: protocol.ModeOneShot, State: protocol.RunRunning, CreatedAt: store.NowMs()})
	if err := s.Store.AddOwnership(ctx, "C", "X"); err != nil {
		t.Fatal(err)
	}
	if err := s.Store.AddOwnership(ctx, "F", "X"); err != nil {
		t.Fatal(err)
	}
	gone, err := store.Put(ctx, s.Store.Agents, store.LeaseKey("spawn", "GONE"), protocol.AgentRecord{SessionID: "GONE"})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Delete(ctx, s.Store.Agents, store.LeaseKey("spawn", "GONE"), gone); err != nil {
		t.Fatal(err)
	}
	agents, runs := s.Store.Subj.BucketAgents(), s.Store.Subj.BucketRuns()
	read := func(provider, bucket, key string) (protocol.KVLatestReply, error) {
		var reply protocol.KVLatestReply
		err := rpc.Call(ctx, s.Store.NC, s.Store.Subj.KVLatest(provider, bucket), protocol.KVLatestRequest{Key: key}, &reply)
		return reply, err
	}
	for _, tc := range []struct {
		bucket, key string
		found       bool
	}{
		{runs, store.RunSpecKey("spawn", "RS"), true},
		{runs, store.RunStateKey("spawn", "RS"), true},
		{agents, store.OwnsKey("spawn", "C"), true},
		{agents, store.LeaseKey("spawn", "NONE"), false},
	} {
		got, err := read("spawn", tc.bucket, tc.key)
		want, rev, found, lerr := store.LeaderGet(ctx, map[string]jetstream.KeyValue{agents: s.Store.Agents, runs: s.Store.Runs}[tc.bucket], tc.key)
		if err != nil || lerr != nil || got.Found != tc.found || found != tc.found || string(got.Value) != string(want) || got.Revision != rev {
			t.Fatalf("spawn's leader read of %s/%s: %+v, %v; want found %v at %d (%v)", tc.bucket, tc.key, got, err, tc.found, rev, lerr)
		}
	}
	if got, err := read("spawn", agents, store.LeaseKey("spawn", "GONE")); err != nil || got.Found || got.Revision <= gone {
		t.Fatalf("a deleted lease: %+v, %v; want not found at its delete marker, after %d", got, err, gone)
	}
	for _, tc := range []struct {
		name, provider, bucket, key string
		code                        protocol.Code
	}{
		{"another provider's spec", "spawn", runs, store.RunSpecKey("fork", "RF"), protocol.CodeUnauthorized},
		{"another provider's state", "spawn", runs, store.RunStateKey("fork", "RF"), protocol.CodeUnauthorized},
		{"another provider's ownership record", "spawn", agents, store.OwnsKey("fork", "F"), protocol.CodeUnauthorized},
		{"another provider's lease", "spawn", agents, store.LeaseKey("fork", "F"), protocol.CodeUnauthorized},
		{"a root's lease", "spawn", agents, store.RootLeaseKey(root.SessionID), protocol.CodeUnauthorized},
		{"a root's ownership record", "spawn", agents, store.OwnsKey(protocol.ScopeRoot, root.SessionID), protocol.CodeUnauthorized},
		{"a grant", "spawn", agents, store.GrantKey("ab12"), protocol.CodeUnauthorized},
		{"a slots record", "spawn", agents, store.SlotsKey(root.SessionID), protocol.CodeUnauthorized},
		{"a spec by a pattern", "spawn", runs, store.RunSpecPattern("RS"), protocol.CodeUnauthorized},
		{"every key", "spawn", runs, ">", protocol.CodeUnauthorized},
		{"its own provider's specs by a pattern", "spawn", runs, "spec.spawn.*", protocol.CodeUnauthorized},
		{"its own provider's leases by a pattern", "spawn", agents, "lease.spawn.>", protocol.CodeUnauthorized},
		{"the hosts bucket", "spawn", s.Store.Subj.BucketHosts(), "spawn.H1", protocol.CodeInvalidArgument},
		{"no key", "spawn", runs, "", protocol.CodeInvalidArgument},
	} {
		got, err := read(tc.provider, tc.bucket, tc.key)
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code != tc.code || got.Found || got.Value != nil {
			t.Errorf("%s (%s/%s as %s): %+v, %v; want %s", tc.name, tc.bucket, tc.key, tc.provider, got, err, tc.code)
		}
	}
}
