package coordinator_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// A host's request to remove inbox items (protocol.Subjects.InboxRemove)
// deletes them only for a child whose header names the provider the
// subject names, and only the items the child's log claims or discards:
// only coordinators delete inbox items, and a worker, which may publish
// only under its own provider's subject, can have removed only what a log
// of its own provider already names (docs/security.md). Every other
// request is refused and every item stays.
func TestInboxItemsAreRemovedOnlyForAChildOfTheSubjectsProviderWhoseLogNamesThem(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := s.Root()
	const child = "C"
	enqueue := func(scope, id, text string) (string, protocol.Seq) {
		t.Helper()
		msgID, seq, err := s.Store.Enqueue(ctx, scope, id, store.InboxItem{Content: protocol.Text(text)}, "")
		if err != nil {
			t.Fatal(err)
		}
		return msgID, seq
	}
	claimedID, claimed := enqueue("spawn", child, "claimed")
	_, pending := enqueue("spawn", child, "pending")
	_, rootItem := enqueue(protocol.ScopeRoot, root.SessionID, "a notice for the root")
	// Another spawn session's item, in the child's inbox stream (a root's
	// items are in another stream, BROOD_INBOX_root, whose sequences the
	// child's inbox does not name).
	_, otherItem := enqueue("spawn", "OTHER", "another session's")
	claim, err := protocol.NewEvent(protocol.EvInboxDequeue, store.NowMs(), protocol.InboxDequeueData{MessageID: claimedID, InboxSeq: claimed, Turn: 1})
	if err != nil {
		t.Fatal(err)
	}
	putChild(t, s, root, child, claim) // a spawn child whose log claimed one item
	remove := func(provider, id string, seqs ...protocol.Seq) (int, error) {
		var reply protocol.InboxAckReply
		err := rpc.Call(ctx, s.NC, s.Store.Subj.InboxRemove(provider, id), protocol.InboxRemoveRequest{Seqs: seqs}, &reply)
		return reply.Removed, err
	}
	for _, tc := range []struct {
		name, provider, id string
		seqs               []protocol.Seq
		code               protocol.Code
	}{
		{"the claimed item under another provider", "fork", child, []protocol.Seq{claimed}, protocol.CodeUnauthorized},
		{"an item its log does not name", "spawn", child, []protocol.Seq{pending}, protocol.CodeUnauthorized},
		{"a root's item", "spawn", root.SessionID, []protocol.Seq{rootItem}, protocol.CodeUnauthorized},
		{"another session's item, named as the child's", "spawn", child, []protocol.Seq{otherItem}, protocol.CodeInvalidArgument},
		{"an item of no session", "spawn", "NOSUCHCHILD", []protocol.Seq{claimed}, protocol.CodeUnauthorized},
		{"no items", "spawn", child, nil, protocol.CodeInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if n, err := remove(tc.provider, tc.id, tc.seqs...); protocol.CodeOf(err) != tc.code || n != 0 {
				t.Fatalf("removed %d, %v; want %s", n, err, tc.code)
			}
			if got := testutil.PendingSeqs(ctx, t, s.Store, child); !slices.Equal(got, []protocol.Seq{claimed, pending}) {
				t.Fatalf("the child's inbox holds %v, want %v", got, []protocol.Seq{claimed, pending})
			}
			if got := testutil.PendingSeqs(ctx, t, s.Store, root.SessionID); !slices.Equal(got, []protocol.Seq{rootItem}) {
				t.Fatalf("the root's inbox holds %v, want %v", got, []protocol.Seq{rootItem})
			}
		})
	}
	if n, err := remove("spawn", child, claimed); err != nil || n != 1 {
		t.Fatalf("removal of the claimed item: %d, %v; want 1", n, err)
	}
	if got := testutil.PendingSeqs(ctx, t, s.Store, child); !slices.Equal(got, []protocol.Seq{pending}) {
		t.Fatalf("the child's inbox holds %v, want only %d", got, pending)
	}
}
