package coordinator_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// A host's request to remove an ownership edge (protocol.Subjects.Ownership)
// removes it, and wakes the owner, only when the child's header names the
// provider the subject names and the request's run is a settled epoch of
// that child under it: only coordinators write ownership records, and a
// worker, which may publish only under its own provider's subject, can end
// the ownership of its own provider's children, and only of an epoch that
// is over (docs/security.md). Every other request is refused and the edge
// stays.
func TestAnOwnershipEdgeGoesOnlyForASettledEpochOfTheSubjectsProvider(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := s.Root()
	now := store.NowMs()
	child := func(id, provider string) {
		t.Helper()
		if err := s.Store.PutHeader(ctx, protocol.SessionHeader{Version: protocol.SessionHeaderVersion, ID: id, CreatedAt: now,
			ParentSession: root.SessionID, Origin: protocol.OriginSubagent, DelegationDepth: 1, Provider: provider}); err != nil {
			t.Fatal(err)
		}
	}
	epoch := func(runID, childID, provider, mode string, settled bool) {
		t.Helper()
		rec := protocol.RunRecord{RunID: runID, ChildID: childID, ParentSession: root.SessionID, Provider: provider, Mode: mode,
			State: protocol.RunRunning, CreatedAt: now}
		rev, err := s.Store.CreateRun(ctx, rec)
		if err != nil {
			t.Fatal(err)
		}
		if settled {
			if won, err := s.Store.SettleRun(ctx, store.Settled(rec, provider+".H1", protocol.SubagentResult{StopReason: protocol.StopCompleted}), rev); err != nil || !won {
				t.Fatalf("settle %s: %v, %v", runID, won, err)
			}
		}
	}
	const owner = "OWNER"
	child("C", "spawn")
	child("F", "fork")
	epoch("C-running", "C", "spawn", protocol.ModeContinuable, false)
	epoch("C-settled", "C", "spawn", protocol.ModeContinuable, true)
	epoch("F-settled", "F", "fork", protocol.ModeContinuable, true)
	epoch("C-oneshot", "C", "spawn", protocol.ModeOneShot, true)
	for _, id := range []string{"C", "F"} {
		if err := s.Store.AddOwnership(ctx, owner, id); err != nil {
			t.Fatal(err)
		}
	}
	owned := func() []string {
		t.Helper()
		rec, err := s.Store.OwnershipLatest(ctx, owner)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return rec.Value.Children
	}
	release := func(provider, childID, runID string) error {
		return rpc.Call(ctx, s.NC, s.Store.Subj.Ownership(provider, childID), protocol.OwnershipReleaseRequest{Owner: owner, RunID: runID}, &protocol.Empty{})
	}
	for _, tc := range []struct {
		name                 string
		provider, child, run string
		want                 protocol.Code
	}{
		{"another provider than the child's header's", "spawn", "F", "F-settled", protocol.CodeUnauthorized},
		{"the child's provider, a run of another provider's child", "fork", "F", "C-settled", protocol.CodeUnauthorized},
		{"an epoch that still runs", "spawn", "C", "C-running", protocol.CodeUnauthorized},
		{"a one-shot run, no epoch", "spawn", "C", "C-oneshot", protocol.CodeUnauthorized},
		{"another child's settled epoch", "spawn", "C", "F-settled", protocol.CodeUnauthorized},
		{"no run", "spawn", "C", "NONE", protocol.CodeUnauthorized},
		{"no child", "spawn", "NOBODY", "C-settled", protocol.CodeUnauthorized},
		{"a scope that is no provider", "root", "C", "C-settled", protocol.CodeUnauthorized},
		{"no run id", "spawn", "C", "", protocol.CodeInvalidArgument},
	} {
		if err := release(tc.provider, tc.child, tc.run); protocol.CodeOf(err) != tc.want {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.want)
		}
		if got := owned(); !slices.Equal(got, []string{"C", "F"}) {
			t.Fatalf("%s: the owner's children are %v, want [C F]", tc.name, got)
		}
	}
	wake := testutil.Subscribe(t, s.NC, s.Store.Subj.Wake(owner))
	if err := release("spawn", "C", "C-settled"); err != nil {
		t.Fatalf("a settled epoch of a spawn child, on spawn's subject: %v", err)
	}
	if got := owned(); !slices.Equal(got, []string{"F"}) {
		t.Fatalf("the owner's children are %v, want [F]", got)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return len(wake) > 0 }, "the owner's wake-up")
	if err := release("fork", "F", "F-settled"); err != nil {
		t.Fatalf("a settled epoch of a fork child, on fork's subject: %v", err)
	}
	if got := owned(); len(got) != 0 {
		t.Fatalf("the owner's children are %v, want none", got)
	}
}
