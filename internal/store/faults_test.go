package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestFaultsSeeEveryWriteAndDecideItsAnswer: a store made by WithFaults
// passes each kind of write through the hooks, with what names it; a Before
// error fails the write unsent, and an After error replaces the answer of a
// write that landed. The store it was made from is untouched.
func TestFaultsSeeEveryWriteAndDecideItsAnswer(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	injected := errors.New("injected")
	var mu sync.Mutex
	var seen []store.Write
	var refuse, lose func(store.Write) bool
	f := st.WithFaults(store.Faults{
		Before: func(_ context.Context, w store.Write) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, w)
			if refuse != nil && refuse(w) {
				return injected
			}
			return nil
		},
		After: func(_ context.Context, w store.Write, err error) error {
			mu.Lock()
			defer mu.Unlock()
			if err == nil && lose != nil && lose(w) {
				return injected
			}
			return err
		},
	})
	last := func() store.Write {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == 0 {
			t.Fatal("no write seen")
		}
		return seen[len(seen)-1]
	}
	agents := st.Agents.Bucket()
	rec := protocol.OwnershipRecord{Children: []string{"a"}}

	rev, err := store.Create(ctx, f.Agents, "k", rec)
	if w := last(); err != nil || w.Op != store.OpKVCreate || w.Bucket != agents || w.Key != "k" {
		t.Fatalf("create: %v, seen %+v", err, w)
	}
	if _, err := store.Update(ctx, f.Agents, "k", rec, rev); err != nil || last().Op != store.OpKVUpdate || last().Revision != rev {
		t.Fatalf("update: %v, seen %+v", err, last())
	}
	if _, err := store.Put(ctx, f.Agents, "k", rec); err != nil || last().Op != store.OpKVPut {
		t.Fatalf("put: %v, seen %+v", err, last())
	}
	if _, err := f.Agents.PutString(ctx, "k2", "v"); err != nil || last().Op != store.OpKVPut || last().Key != "k2" {
		t.Fatalf("put string: %v, seen %+v", err, last())
	}
	_ = f.Agents.Purge(ctx, "k2") // refused: no bucket allows roll-ups (provision.go)
	if w := last(); w.Op != store.OpKVDelete || w.Key != "k2" {
		t.Fatalf("purge seen as %+v", w)
	}
	if err := store.Delete(ctx, f.Agents, "k", 0); err != nil || last().Op != store.OpKVDelete {
		t.Fatalf("delete: %v, seen %+v", err, last())
	}
	_, seq, err := f.Enqueue(ctx, protocol.ScopeRoot, "S", store.InboxItem{Content: protocol.Text("hi")}, "")
	if w := last(); err != nil || w.Op != store.OpPublish || w.Subject != st.Subj.Inbox(protocol.ScopeRoot, "S") || w.Msg == nil || w.Async {
		t.Fatalf("enqueue: %v, seen %+v", err, w)
	}
	if err := f.InboxOf(protocol.ScopeRoot, "S").Remove(ctx, seq); err != nil || last().Op != store.OpMsgDelete || last().Seq != uint64(seq) || last().Stream != st.Subj.StreamInbox(protocol.ScopeRoot) {
		t.Fatalf("remove: %v, seen %+v", err, last())
	}
	inbox, err := f.InboxStream(ctx, protocol.ScopeRoot)
	if err != nil {
		t.Fatal(err)
	}
	if err := inbox.SecureDeleteMsg(ctx, uint64(seq)); err == nil || last().Op != store.OpMsgDelete {
		t.Fatalf("secure delete of a removed item: %v, seen %+v", err, last())
	}
	fut, err := f.JS.PublishMsgAsync(&nats.Msg{Subject: st.Subj.Log(protocol.ScopeRoot, "async"), Data: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if w := last(); w.Op != store.OpPublish || !w.Async || w.Subject != st.Subj.Log(protocol.ScopeRoot, "async") {
		t.Fatalf("async publish seen as %+v", w)
	}
	select { // its acknowledgement, so nothing waits for it after the test
	case <-fut.Ok():
	case err := <-fut.Err():
		t.Fatalf("async publish: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no acknowledgement of the async publish within 10 s")
	}
	if _, err := f.JS.Publish(ctx, st.Subj.Log(protocol.ScopeRoot, "S"), []byte("x")); err != nil || last().Subject != st.Subj.Log(protocol.ScopeRoot, "S") {
		t.Fatalf("publish: %v, seen %+v", err, last())
	}

	// Before refuses: nothing lands.
	mu.Lock()
	refuse = func(w store.Write) bool { return true }
	mu.Unlock()
	if _, err := store.Create(ctx, f.Agents, "refused", rec); !errors.Is(err, injected) {
		t.Fatalf("refused create answered %v", err)
	}
	if _, err := store.Get[protocol.OwnershipRecord](ctx, st.Agents, "refused"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused create landed: %v", err)
	}
	if _, err := f.JS.PublishAsync(st.Subj.Log(protocol.ScopeRoot, "S"), []byte("y")); !errors.Is(err, injected) {
		t.Fatalf("refused async publish answered %v", err)
	}
	if err := inbox.DeleteMsg(ctx, 1); !errors.Is(err, injected) {
		t.Fatalf("refused delete answered %v", err)
	}

	// After loses the answer: the write landed all the same.
	mu.Lock()
	refuse, lose = nil, func(w store.Write) bool { return w.Op == store.OpKVCreate || w.Op == store.OpPublish }
	mu.Unlock()
	if _, err := store.Create(ctx, f.Agents, "landed", rec); !errors.Is(err, injected) {
		t.Fatalf("create whose answer was lost answered %v", err)
	}
	if r, err := store.Get[protocol.OwnershipRecord](ctx, st.Agents, "landed"); err != nil || r.Value.Children[0] != "a" {
		t.Fatalf("the create whose answer was lost did not land: %v", err)
	}
	if _, _, err := f.Enqueue(ctx, protocol.ScopeRoot, "S", store.InboxItem{Content: protocol.Text("lost ack")}, ""); !errors.Is(err, injected) {
		t.Fatalf("enqueue whose answer was lost answered %v", err)
	}
	if n, err := st.InboxOf(protocol.ScopeRoot, "S").Count(ctx); err != nil || n != 1 {
		t.Fatalf("inbox holds %d items (%v), want the item whose answer was lost", n, err)
	}
	// The original store has no hooks.
	n := len(seen)
	if _, err := store.Put(ctx, st.Agents, "plain", rec); err != nil {
		t.Fatal(err)
	}
	if len(seen) != n {
		t.Fatal("the store WithFaults was made from passed a write through the hooks")
	}
}
