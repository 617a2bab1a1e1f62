package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/embedded"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

func TestHeaderIsWrittenOnceEver(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	h := protocol.SessionHeader{Version: 1, ID: "S1", CreatedAt: 1, Cwd: "/w"}
	if err := st.PutHeader(ctx, h); err != nil {
		t.Fatal(err)
	}
	if err := st.PutHeader(ctx, h); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a second writer of the same id must conflict: %v", err)
	}
	h2 := h
	h2.Cwd = "/other"
	if err := st.PutHeader(ctx, h2); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("second header = %v, want ErrConflict", err)
	}
	got, err := st.GetHeader(ctx, "S1")
	if err != nil || got.Cwd != "/w" {
		t.Fatalf("header = %+v, %v", got, err)
	}
	if _, err := st.GetHeader(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing header = %v", err)
	}
}

func event(t *testing.T, turn int64) protocol.SessionEvent {
	ev, err := protocol.NewEvent(protocol.EvTurnStart, 1, protocol.TurnData{Turn: turn})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func TestLogIsFencedAndReadBackCompletely(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	w := st.NewLogWriter(protocol.ScopeRoot, "A", 0, 0)
	other := st.NewLogWriter(protocol.ScopeRoot, "B", 0, 0)
	const records = 1200 // more than one batch get
	for i := 0; i < records; i++ {
		if _, err := w.Append(ctx, event(t, int64(2*i)), event(t, int64(2*i+1))); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		if i%3 == 0 { // interleave another session's records
			if _, err := other.Append(ctx, event(t, int64(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	log, err := st.ReadLog(ctx, protocol.ScopeRoot, "A")
	if err != nil {
		t.Fatal(err)
	}
	if len(log.Events) != 2*records || log.LastSubjSeq != w.LastSubjSeq() {
		t.Fatalf("read %d events up to %d, want %d up to %d", len(log.Events), log.LastSubjSeq, 2*records, w.LastSubjSeq())
	}
	// A second writer continuing from what it read takes over; the first is fenced.
	taker := st.NewLogWriter(protocol.ScopeRoot, "A", log.LastSubjSeq, int64(len(log.Events)))
	if _, err := taker.Append(ctx, event(t, 9999)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(ctx, event(t, 1)); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("stale writer append = %v, want ErrFenced", err)
	}
	if _, err := w.Append(ctx, event(t, 1)); !errors.Is(err, store.ErrFenced) {
		t.Fatal("a fenced writer stays fenced")
	}
	empty, err := st.ReadLog(ctx, protocol.ScopeRoot, "nobody")
	if err != nil || len(empty.Events) != 0 || empty.LastSubjSeq != 0 {
		t.Fatalf("empty log = %+v, %v", empty, err)
	}
}

func TestOversizedRecordIsRefusedNotTruncated(t *testing.T) {
	st := testutil.NewStore(t)
	big := make([]byte, 2<<20)
	for i := range big {
		big[i] = 'x'
	}
	ev, _ := protocol.NewEvent(protocol.EvUserMessage, 1, protocol.UserMessageData{Content: protocol.Text(string(big))})
	_, err := st.NewLogWriter(protocol.ScopeRoot, "A", 0, 0).Append(context.Background(), ev)
	if protocol.CodeOf(err) != protocol.CodeLimitExceeded {
		t.Fatalf("err = %v, want LIMIT_EXCEEDED", err)
	}
}

func TestKVRecordsCompareAndSet(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	rev, err := store.Create(ctx, st.Runs, "R", protocol.RunRecord{RunID: "R", State: protocol.RunRunning})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Create(ctx, st.Runs, "R", protocol.RunRecord{RunID: "R"}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("second create = %v", err)
	}
	winners := 0
	for i := 0; i < 3; i++ {
		_, err := store.Update(ctx, st.Runs, "R", protocol.RunRecord{RunID: "R", State: protocol.RunSettled, SettledBy: fmt.Sprint(i)}, rev)
		if err == nil {
			winners++
		} else if !errors.Is(err, store.ErrConflict) {
			t.Fatal(err)
		}
	}
	if winners != 1 {
		t.Fatalf("%d settlements won; exactly one may", winners)
	}
	got, err := store.Get[protocol.RunRecord](ctx, st.Runs, "R")
	if err != nil || got.Value.SettledBy != "0" {
		t.Fatalf("record = %+v, %v", got, err)
	}
}

// TestSmallMaxPayloadIsRefusedAtStart is issue 14, item 7: a server whose
// max_payload is below the 1 MiB Brood's records need is refused when a
// service starts, saying why, instead of failing its first large record later.
func TestSmallMaxPayloadIsRefusedAtStart(t *testing.T) {
	s, err := embedded.Start(embedded.Config{Host: "127.0.0.1", Port: -1, DataDir: t.TempDir(), ServerName: "small", MaxPayloadBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	nc := testutil.Connect(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = store.Provision(ctx, nc, protocol.MustSubjects(""), store.DefaultConfig())
	if !errors.Is(err, store.ErrMaxPayload) || !strings.Contains(err.Error(), "it is 65536 bytes, and Brood's records need 1048576") ||
		!strings.Contains(err.Error(), "max_payload") {
		t.Fatalf("provision = %v, want ErrMaxPayload naming both sizes", err)
	}
	if _, err := store.Bind(ctx, nc, protocol.MustSubjects("")); !errors.Is(err, store.ErrMaxPayload) {
		t.Fatalf("bind = %v, want ErrMaxPayload", err)
	}
	// The default server (1 MiB) is accepted.
	testutil.NewStore(t)
}

func TestLogTailReadsOnlyAsFarBackAsNeeded(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	w := st.NewLogWriter(protocol.ScopeRoot, "A", 0, 0)
	other := st.NewLogWriter(protocol.ScopeRoot, "B", 0, 0)
	const records = 3000
	for i := 0; i < records; i++ {
		if _, err := w.Append(ctx, event(t, 0)); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		if _, err := other.Append(ctx, event(t, 0)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name      string
		needSeq   int64 // enough once an event with this seq (or earlier) was read
		wantWhole bool
	}{
		{"the last few events", records - 5, false},
		{"further back: the window widens", records - 800, false},
		{"everything", 0, true},
	} {
		var calls int
		evs, whole, err := st.ReadLogTail(ctx, protocol.ScopeRoot, "A", func(evs []protocol.SessionEvent) bool {
			calls++
			return len(evs) > 0 && evs[0].Seq <= tc.needSeq
		})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if whole != tc.wantWhole || len(evs) == 0 || evs[0].Seq > tc.needSeq || evs[len(evs)-1].Seq != records-1 {
			t.Fatalf("%s: whole %v, events %d..%d", tc.name, whole, evs[0].Seq, evs[len(evs)-1].Seq)
		}
		for i := 1; i < len(evs); i++ {
			if evs[i].Seq != evs[i-1].Seq+1 {
				t.Fatalf("%s: not contiguous at %d", tc.name, i)
			}
		}
		if !tc.wantWhole && len(evs) >= records {
			t.Fatalf("%s: read the whole log (%d events)", tc.name, len(evs))
		}
		if tc.needSeq == records-5 && (calls != 1 || len(evs) > store.LogTailWindow) {
			t.Fatalf("%s: %d reads, %d events; want one read of at most %d", tc.name, calls, len(evs), store.LogTailWindow)
		}
	}
	if evs, whole, err := st.ReadLogTail(ctx, protocol.ScopeRoot, "nobody", func([]protocol.SessionEvent) bool { return false }); err != nil || !whole || len(evs) != 0 {
		t.Fatalf("empty log: %v %v %v", evs, whole, err)
	}
}

// TestInboxPendingIsCompleteOrAnError: Pending returns every pending item of
// the session, across batches and beside other sessions' items, or an error;
// a read whose deadline passed is an error, never a short (empty) list, so
// an activation never takes a cut-off read for an empty inbox.
func TestInboxPendingIsCompleteOrAnError(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	const n = 2*store.InboxReadBatch + 88
	var seqs []protocol.Seq
	for i := 0; i < n; i++ {
		for _, id := range []string{"S1", "S2"} {
			_, seq, err := st.Enqueue(ctx, protocol.ScopeRoot, id, store.InboxItem{Content: protocol.Text(fmt.Sprintf("%s %d", id, i))}, "")
			if err != nil {
				t.Fatal(err)
			}
			if id == "S1" {
				seqs = append(seqs, seq)
			}
		}
	}
	tests := []struct {
		name  string
		id    string
		after protocol.Seq
		want  []protocol.Seq
	}{
		{"all of them", "S1", 0, seqs},
		{"after a sequence", "S1", seqs[300], seqs[301:]},
		{"after the last", "S1", seqs[n-1], nil},
		{"an empty inbox", "S3", 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			items, err := st.InboxOf(protocol.ScopeRoot, tc.id).Pending(ctx, tc.after)
			if err != nil {
				t.Fatal(err)
			}
			if len(items) != len(tc.want) {
				t.Fatalf("%d items, want %d", len(items), len(tc.want))
			}
			for i, it := range items {
				if it.Seq != tc.want[i] {
					t.Fatalf("item %d has seq %d, want %d", i, it.Seq, tc.want[i])
				}
			}
		})
	}
	expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	if items, err := st.InboxOf(protocol.ScopeRoot, "S1").Pending(expired, 0); err == nil {
		t.Fatalf("a read past its deadline returned %d items and no error", len(items))
	}
}

// A header written through a Store is what that Store knows of its
// session's lease from then on, without reading it back: the coordinators'
// lease index checks every new child lease against its header on its
// watch's path, and a read per run there let the watch fall behind under
// load (issue 12: live-children slots of ended children piled up for want
// of the lease's deletion being seen). Shown by removing the stored header:
// the writer still answers from what it wrote, a Store that did not write
// it finds no header. A header refused (a second one for the id) teaches
// nothing.
func TestAHeaderWrittenIsKnownWithoutReadingItBack(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	h := protocol.SessionHeader{Version: 1, ID: "C1", CreatedAt: 1, Cwd: "/w", ParentSession: "P1", Provider: "spawn", Origin: protocol.OriginSubagent}
	if err := st.PutHeader(ctx, h); err != nil {
		t.Fatal(err)
	}
	other := h
	other.Provider, other.ParentSession = "fork", "P2"
	if err := st.PutHeader(ctx, other); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("second header = %v, want ErrConflict", err)
	}
	stream, err := st.JS.Stream(ctx, st.Subj.StreamSessions())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject(st.Subj.Session("C1"))); err != nil {
		t.Fatal(err)
	}
	lease := protocol.AgentRecord{SessionID: "C1", Kind: protocol.AgentOneShot, HostID: "spawn.H1", Epoch: 1, RunID: "C1", Provider: "spawn", ParentSession: "P1"}
	if err := st.LeaseBelongs(ctx, store.LeaseKey("spawn", "C1"), lease); err != nil {
		t.Fatalf("the writer's check of the lease its header names: %v", err)
	}
	if scope, err := st.SessionScope(ctx, "C1"); err != nil || scope != "spawn" {
		t.Fatalf("the writer's scope of C1 = %q, %v; want spawn, as written", scope, err)
	}
	fresh := testutil.Store(t, st.NC)
	if scope, err := fresh.SessionScope(ctx, "C1"); err != nil || scope != "" {
		t.Fatalf("a Store that did not write the header: scope %q, %v; want none (the header is gone)", scope, err)
	}
}
