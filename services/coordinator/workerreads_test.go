package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// putForkChild writes the header of child, of provider, forked from parent
// with seed events of its log.
func putForkChild(t *testing.T, s *stack.Stack, parent, provider, child string, seed int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Store.PutHeader(ctx, protocol.SessionHeader{Version: protocol.SessionHeaderVersion, ID: child, CreatedAt: store.NowMs(),
		ParentSession: parent, Origin: protocol.OriginSubagent, DelegationDepth: 2, Provider: provider, SeedLength: seed}); err != nil {
		t.Fatal(err)
	}
}

// A host's fork seed read (protocol.Subjects.Read, ReadForkSeed) answers
// the parent's log below the fork point only, page by page, and only for a
// fork child whose header names the subject's provider and the parent the
// request names; everything else is UNAUTHORIZED with no event (a worker
// reads no header and no other provider's log itself: docs/security.md).
func TestAForkSeedIsReadOnlyBelowTheForkPointOfTheSubjectsProvidersChild(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := s.Root()
	const parent = "P"
	var events []protocol.SessionEvent
	for i := 0; i < 10; i++ {
		ev, err := protocol.NewEvent(protocol.EvTurnStart, 1, protocol.TurnData{Turn: int64(i)})
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, ev)
	}
	putChild(t, s, root, parent, events...) // a spawn child with 10 events
	putForkChild(t, s, parent, "fork", "F", 6)
	putForkChild(t, s, parent, "fork", "UNSEEDED", 0)
	read := func(provider, child string, r protocol.ForkSeedRequest) (protocol.LogPage, error) {
		var page protocol.LogPage
		err := rpc.Call(ctx, s.NC, s.Store.Subj.Read(provider, protocol.ReadForkSeed, child), r, &page)
		return page, err
	}
	var seed []protocol.SessionEvent
	r := protocol.ForkSeedRequest{Parent: parent, EventsMax: 4}
	for pages := 1; ; pages++ {
		page, err := read("fork", "F", r)
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		seed = append(seed, page.Events...)
		if page.Complete {
			if pages != 2 {
				t.Fatalf("the seed came in %d pages of at most 4 events, want 2", pages)
			}
			break
		}
		if pages == 2 {
			t.Fatalf("the second page is not complete: %+v", page)
		}
		r.FromSeq, r.Cursor = page.NextSeq, page.Cursor
	}
	if len(seed) != 6 {
		t.Fatalf("the seed has %d events, want the 6 below the fork point", len(seed))
	}
	for i, ev := range seed {
		if ev.Seq != int64(i) {
			t.Fatalf("seed event %d has seq %d", i, ev.Seq)
		}
	}
	for _, tc := range []struct {
		name, provider, child string
		r                     protocol.ForkSeedRequest
	}{
		{"the fork point", "fork", "F", protocol.ForkSeedRequest{Parent: parent, FromSeq: 6}},
		{"past the fork point", "fork", "F", protocol.ForkSeedRequest{Parent: parent, FromSeq: 8}},
		{"under another provider", "spawn", "F", protocol.ForkSeedRequest{Parent: parent}},
		{"of another parent", "fork", "F", protocol.ForkSeedRequest{Parent: root.SessionID}},
		{"of a child that is no fork", "fork", "UNSEEDED", protocol.ForkSeedRequest{Parent: parent}},
		{"of the parent itself", "spawn", parent, protocol.ForkSeedRequest{Parent: root.SessionID}},
		{"of no session", "fork", "NOSUCH", protocol.ForkSeedRequest{Parent: parent}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			page, err := read(tc.provider, tc.child, tc.r)
			if protocol.CodeOf(err) != protocol.CodeUnauthorized || len(page.Events) > 0 {
				t.Fatalf("%d events, %v; want UNAUTHORIZED and none", len(page.Events), err)
			}
		})
	}
}

// A host's ancestry read (protocol.Subjects.Read, ReadAncestry) answers
// what store.EndedAncestor finds over the child's ancestors, read from the
// headers by the coordinator, and only for a child whose header names the
// subject's provider.
func TestAnAncestryIsReadOnlyForTheSubjectsProvidersChild(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := s.Root()
	putChild(t, s, root, "ENDED") // a one-shot child whose run ended: no lease
	if err := s.Store.PutChildIndex(ctx, root.SessionID, protocol.ChildIndexRecord{ChildID: "ENDED", CreatedAt: store.NowMs(), Mode: protocol.ModeOneShot, Provider: "spawn"}); err != nil {
		t.Fatal(err)
	}
	putForkChild(t, s, "ENDED", "fork", "UNDER", 0)
	putChild(t, s, root, "LIVE") // no lease, no index entry, no descriptor: not one-shot
	putForkChild(t, s, "LIVE", "fork", "FREE", 0)
	ancestry := func(provider, child string) (string, error) {
		var r protocol.AncestryReply
		err := rpc.Call(ctx, s.NC, s.Store.Subj.Read(provider, protocol.ReadAncestry, child), protocol.Empty{}, &r)
		return r.EndedAncestor, err
	}
	if anc, err := ancestry("fork", "UNDER"); err != nil || anc != "ENDED" {
		t.Fatalf("the ended ancestor of UNDER: %q, %v; want ENDED", anc, err)
	}
	if anc, err := ancestry("fork", "FREE"); err != nil || anc != "" {
		t.Fatalf("the ended ancestor of FREE: %q, %v; want none", anc, err)
	}
	for _, tc := range []struct{ name, provider, child string }{
		{"under another provider", "spawn", "UNDER"},
		{"of a root", "spawn", root.SessionID},
		{"of no session", "fork", "NOSUCH"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if anc, err := ancestry(tc.provider, tc.child); protocol.CodeOf(err) != protocol.CodeUnauthorized || anc != "" {
				t.Fatalf("%q, %v; want UNAUTHORIZED", anc, err)
			}
		})
	}
}
