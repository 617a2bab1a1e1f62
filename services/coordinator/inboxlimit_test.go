package coordinator_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestFollowupsStopAtTheInboxLimit: a continuable child's inbox holds at
// most 1,000 pending items (store.DefaultConfig, README "Limits"); the
// followup that would be the 1,001st is refused LIMIT_EXCEEDED through
// continuable.followup, nothing accepted is lost, and every pending item
// reads back in order, well past one batch of InboxReadBatch (256).
func TestFollowupsStopAtTheInboxLimit(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	if got := s.Store.Cfg.InboxItemsMax; got != 1000 {
		t.Fatalf("the default inbox limit is %d, want 1000", got)
	}
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{
		Provider: "spawn", Parent: root.Ref(), Label: "busy", Prompt: protocol.Text("sleep 60s\nsay late"),
	})
	if err != nil {
		t.Fatal(err)
	}
	in := testutil.InboxOf(t, s.Store, start.ChildID)
	testutil.Eventually(t, 30*time.Second, func() bool {
		n, err := in.Count(ctx)
		return err == nil && n == 0
	}, "the first turn claims its prompt")
	// 999 items straight into the stream, then the 1,000th and 1,001st
	// through the endpoint.
	var want []string
	for i := 0; i < 999; i++ {
		mid, _, err := s.Store.Enqueue(ctx, testutil.ScopeOf(t, s.Store, start.ChildID), start.ChildID, store.InboxItem{
			Content: protocol.Text(fmt.Sprintf("say %d", i)), Source: protocol.MessageSource{Kind: protocol.SourceUser},
		}, "")
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
		want = append(want, mid)
	}
	auth := protocol.Authority{Parent: ptr(root.Ref())}
	last, err := s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: start.ChildID, Authority: auth, Message: protocol.Text("say the 1000th")})
	if err != nil {
		t.Fatalf("the 1,000th item was refused: %v", err)
	}
	want = append(want, last.MessageID)
	_, err = s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: start.ChildID, Authority: auth, Message: protocol.Text("say one too many")})
	if protocol.CodeOf(err) != protocol.CodeLimitExceeded {
		t.Fatalf("the 1,001st item: %v, want LIMIT_EXCEEDED", err)
	}
	items, err := in.Pending(ctx, 0)
	if err != nil {
		t.Fatalf("read %d pending items: %v", len(want), err)
	}
	if len(items) != len(want) {
		t.Fatalf("read %d pending items, want %d", len(items), len(want))
	}
	for i, it := range items {
		if it.MessageID != want[i] {
			t.Fatalf("item %d is %s, want %s (in order)", i, it.MessageID, want[i])
		}
	}
	// The child is disposed with its queue at the end of the test; the items
	// stay accepted (a dispose keeps the inbox).
}

// TestDefaultLiveChildrenBoundContinuableStarts: with no limit configured a
// parent may have 64 live children (README "Limits"), counted on the
// continuable.start path too: the 65th start waits in the parent's start
// queue (state queued) while the 64 live ones run, and no session was
// created for it yet.
func TestDefaultLiveChildrenBoundContinuableStarts(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const limit = 64
	for i := 0; i < limit; i++ {
		if _, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{
			Provider: "spawn", Parent: root.Ref(), Label: fmt.Sprintf("c%d", i), Prompt: protocol.Text("sleep 120s\nsay late"),
		}); err != nil {
			t.Fatalf("live child %d of %d refused: %v", i+1, limit, err)
		}
	}
	headers := s.SessionCount()
	r, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{
		Provider: "spawn", Parent: root.Ref(), Label: "one-too-many", Prompt: protocol.Text("say x"),
	})
	if err != nil || r.State != protocol.StateQueued {
		t.Fatalf("the 65th live child: %+v %v, want state queued", r, err)
	}
	if got := s.SessionCount(); got != headers {
		t.Fatalf("a queued start wrote %d session headers", got-headers)
	}
}
