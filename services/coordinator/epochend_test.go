package coordinator_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// A host's request for the end of an epoch (protocol.Subjects.EpochEnd)
// delivers the settlement notice the run's records hold into the parent's
// inbox, removes the ownership edge and wakes the owner, only when the
// request's run is, by its spec, a settled epoch of that child of the
// provider the subject names: only coordinators write ownership records
// and other sessions' inboxes, and a worker, which may publish only under
// its own provider's subject, can end only its own provider's children's
// epochs, and only those that are over (docs/security.md). Every other
// request is refused: the edge stays, the parent's inbox stays empty.
func TestAnEpochsEndIsCarriedOutOnlyForASettledEpochOfTheSubjectsProvider(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := s.Root()
	now := store.NowMs()
	epoch := func(runID, childID, provider, mode string, settled bool) {
		t.Helper()
		rec := protocol.RunRecord{RunID: runID, ChildID: childID, ParentSession: root.SessionID, Provider: provider, Mode: mode,
			State: protocol.RunRunning, CreatedAt: now}
		if settled {
			rec = store.Settled(rec, provider+".H1", protocol.SubagentResult{Output: protocol.Text("result of " + runID), StopReason: protocol.StopCompleted})
		}
		putRun(t, s, rec)
	}
	const owner = "OWNER"
	putChildOf(t, s, root, "fork", owner) // its wake-up is on its provider's subject
	putChildOf(t, s, root, "spawn", "C")
	putChildOf(t, s, root, "fork", "F")
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
		return rpc.Call(ctx, s.NC, s.Store.Subj.EpochEnd(provider, childID), protocol.EpochEndRequest{Owner: owner, RunID: runID}, &protocol.Empty{})
	}
	// notices returns the texts of the root's pending inbox items.
	notices := func() []string {
		t.Helper()
		items, _, err := s.Store.ReadInboxPage(ctx, testutil.ScopeOf(t, s.Store, root.SessionID), root.SessionID, 0, 100, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		var texts []string
		for _, it := range items {
			texts = append(texts, protocol.PlainText(it.Content))
		}
		return texts
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
		if got := notices(); len(got) != 0 {
			t.Fatalf("%s: the parent's inbox holds %q, want nothing", tc.name, got)
		}
	}
	wake := testutil.Subscribe(t, s.NC, s.Store.Subj.Wake("fork", owner))
	if err := release("spawn", "C", "C-settled"); err != nil {
		t.Fatalf("a settled epoch of a spawn child, on spawn's subject: %v", err)
	}
	if got := owned(); !slices.Equal(got, []string{"F"}) {
		t.Fatalf("the owner's children are %v, want [F]", got)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return len(wake) > 0 }, "the owner's wake-up")
	if got := notices(); len(got) != 1 || !strings.Contains(got[0], "result of C-settled") {
		t.Fatalf("the parent's inbox holds %q, want the settlement notice of C-settled", got)
	}
	// Again (a host that heard no answer asks again): nothing more.
	if err := release("spawn", "C", "C-settled"); err != nil {
		t.Fatalf("the same end again: %v", err)
	}
	if got := notices(); len(got) != 1 {
		t.Fatalf("the parent's inbox holds %q after the same end again, want one notice", got)
	}
	if err := release("fork", "F", "F-settled"); err != nil {
		t.Fatalf("a settled epoch of a fork child, on fork's subject: %v", err)
	}
	if got := owned(); len(got) != 0 {
		t.Fatalf("the owner's children are %v, want none", got)
	}
}
