package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

func TestTransient(t *testing.T) {
	api := func(code jetstream.ErrorCode) error {
		return fmt.Errorf("nats: %w", &jetstream.APIError{ErrorCode: code, Code: 503})
	}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"no responders", nats.ErrNoResponders, true},
		{"no response from stream", jetstream.ErrNoStreamResponse, true},
		{"attempt timed out", context.DeadlineExceeded, true},
		{"request timeout", nats.ErrTimeout, true},
		{"reconnecting", nats.ErrConnectionReconnecting, true},
		{"incomplete read (a lagging replica)", fmt.Errorf("read log X: %w", store.ErrIncompleteRead), true},
		{"temporarily unavailable (10008)", api(10008), true},
		{"cluster cannot handle request (10009)", api(10009), true},
		{"stream offline (10118)", api(10118), true},
		{"duplicate message id in process (10158)", api(10158), true},
		{"expected last sequence not ready (10163)", api(10163), true},
		{"wrong last sequence (10071)", api(jetstream.JSErrCodeStreamWrongLastSequence), false},
		{"wrong last sequence, replicated (10164)", api(jetstream.JSErrCodeStreamWrongLastSequenceConstant), false},
		{"store failed (10077)", api(10077), false},
		{"no suitable peers (10005), retried only while provisioning", api(10005), false},
		{"key exists", jetstream.ErrKeyExists, false},
		{"cancelled", context.Canceled, false},
		{"closed", nats.ErrConnectionClosed, false},
		{"conflict", store.ErrConflict, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := store.Transient(c.err); got != c.want {
				t.Fatalf("Transient(%v) = %v, want %v", c.err, got, c.want)
			}
		})
	}
}

// lostAcks is a KV whose first write of each kind lands but answers as if
// the node died before acknowledging it (the answer of a request in flight
// during a leader election).
type lostAcks struct {
	jetstream.KeyValue
	creates, updates, deletes atomic.Int32
}

func (k *lostAcks) Create(ctx context.Context, key string, v []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	rev, err := k.KeyValue.Create(ctx, key, v, opts...)
	if err == nil && k.creates.Add(1) == 1 {
		return 0, context.DeadlineExceeded
	}
	return rev, err
}

func (k *lostAcks) Update(ctx context.Context, key string, v []byte, last uint64) (uint64, error) {
	rev, err := k.KeyValue.Update(ctx, key, v, last)
	if err == nil && k.updates.Add(1) == 1 {
		return 0, jetstream.ErrNoStreamResponse
	}
	return rev, err
}

func (k *lostAcks) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	err := k.KeyValue.Delete(ctx, key, opts...)
	if err == nil && k.deletes.Add(1) == 1 {
		return nats.ErrTimeout
	}
	return err
}

// TestWritesWhoseAnswerWasLostAreRecognised: a compare-and-set whose first
// attempt landed without an answer is retried, comes back as a conflict, and
// is recognised as our own write, not reported lost or conflicting; a real
// conflict stays a conflict.
func TestWritesWhoseAnswerWasLostAreRecognised(t *testing.T) {
	st := testutil.NewStore(t)
	kv := &lostAcks{KeyValue: st.Runs}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	rec := protocol.RunRecord{RunID: "R1", ChildID: "R1", State: protocol.RunRunning, CreatedAt: 1}
	rev, err := store.Create(ctx, kv, "R1", rec)
	if err != nil || rev == 0 {
		t.Fatalf("create whose answer was lost = %d, %v; want our revision", rev, err)
	}
	if _, err := store.Create(ctx, kv, "R1", protocol.RunRecord{RunID: "R1", State: "other"}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("create of an existing key with another value = %v, want ErrConflict", err)
	}
	claimed := rec
	claimed.SettledBy = "H1"
	nrev, err := store.Update(ctx, kv, "R1", claimed, rev)
	if err != nil || nrev <= rev {
		t.Fatalf("update whose answer was lost = %d, %v; want a newer revision", nrev, err)
	}
	got, err := store.Get[protocol.RunRecord](ctx, kv, "R1")
	if err != nil || got.Value.SettledBy != "H1" || got.Revision != nrev {
		t.Fatalf("after the update: %+v rev %d, %v", got.Value, got.Revision, err)
	}
	other := rec
	other.SettledBy = "H2"
	if _, err := store.Update(ctx, kv, "R1", other, rev); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a second claim at the creation revision = %v, want ErrConflict", err)
	}
	if err := store.Delete(ctx, kv, "R1", nrev); err != nil {
		t.Fatalf("conditional delete whose answer was lost = %v", err)
	}
	if _, err := store.Get[protocol.RunRecord](ctx, kv, "R1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after the delete: %v", err)
	}
	if n := kv.creates.Load() + kv.updates.Load() + kv.deletes.Load(); n < 3 {
		t.Fatalf("%d writes reached the bucket; the lost answers were not exercised", n)
	}
}

// lostPublish is a JetStream whose first publish lands but answers as if no
// acknowledgement came.
type lostPublish struct {
	jetstream.JetStream
	n atomic.Int32
}

func (j *lostPublish) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := j.JetStream.PublishMsg(ctx, m, opts...)
	if j.n.Add(1) == 1 && err == nil {
		return nil, jetstream.ErrNoStreamResponse
	}
	return ack, err
}

// TestFencedAppendWhoseAnswerWasLostIsOurs: a log append that landed without
// an acknowledgement is retried, refused by its own fence, recognised by its
// msg id, and the writer goes on after it; a header likewise.
func TestFencedAppendWhoseAnswerWasLostIsOurs(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	for _, name := range []string{"append", "header", "inbox"} {
		t.Run(name, func(t *testing.T) {
			js := &lostPublish{JetStream: st.JS}
			lossy := *st
			lossy.JS = js
			switch name {
			case "append":
				w := lossy.NewLogWriter(protocol.ScopeRoot, "L1", 0, 0)
				if _, err := w.Append(ctx, event(t, 1)); err != nil {
					t.Fatalf("append whose ack was lost: %v", err)
				}
				if _, err := w.Append(ctx, event(t, 2)); err != nil {
					t.Fatalf("next append: %v", err)
				}
				log, err := st.ReadLog(ctx, protocol.ScopeRoot, "L1")
				if err != nil || len(log.Events) != 2 {
					t.Fatalf("log = %d events, %v; want each record once", len(log.Events), err)
				}
			case "header":
				if err := lossy.PutHeader(ctx, protocol.SessionHeader{Version: 1, ID: "H1", CreatedAt: 1, Cwd: "/w"}); err != nil {
					t.Fatalf("header whose ack was lost: %v", err)
				}
				if err := st.PutHeader(ctx, protocol.SessionHeader{Version: 1, ID: "H1", CreatedAt: 1, Cwd: "/w"}); !errors.Is(err, store.ErrConflict) {
					t.Fatalf("another writer's header = %v, want ErrConflict", err)
				}
			case "inbox":
				mid, _, err := lossy.Enqueue(ctx, protocol.ScopeRoot, "I1", store.InboxItem{Content: protocol.Text("x")}, "")
				if err != nil || mid == "" {
					t.Fatalf("enqueue whose ack was lost = %q, %v", mid, err)
				}
				items, err := st.InboxOf(protocol.ScopeRoot, "I1").Pending(ctx, 0)
				if err != nil || len(items) != 1 || items[0].MessageID != mid {
					t.Fatalf("inbox = %+v, %v; want the item once", items, err)
				}
			}
			if js.n.Load() < 2 {
				t.Fatalf("%d publishes; the lost acknowledgement was not retried", js.n.Load())
			}
		})
	}
}

// busyOnce is a KV whose first conditional write of each kind is refused
// with 10164 without being carried out: the answer of a replicated stream
// while another write to the subject is in flight (docs/design.md §12).
type busyOnce struct {
	jetstream.KeyValue
	creates, updates atomic.Int32
}

var errInFlight = fmt.Errorf("nats: %w", &jetstream.APIError{ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant, Code: 400})

func (k *busyOnce) Create(ctx context.Context, key string, v []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if k.creates.Add(1) == 1 {
		return 0, errInFlight
	}
	return k.KeyValue.Create(ctx, key, v, opts...)
}

func (k *busyOnce) Update(ctx context.Context, key string, v []byte, last uint64) (uint64, error) {
	if k.updates.Add(1) == 1 {
		return 0, errInFlight
	}
	return k.KeyValue.Update(ctx, key, v, last)
}

// TestRefusalWhileUnchangedIsRetried: a compare-and-set refused while the
// key is as expected (another write was in flight) is tried again, not
// reported as a lost race; one refused because the key changed is a conflict.
func TestRefusalWhileUnchangedIsRetried(t *testing.T) {
	st := testutil.NewStore(t)
	kv := &busyOnce{KeyValue: st.Runs}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec := protocol.RunRecord{RunID: "B1", State: protocol.RunRunning}
	rev, err := store.Create(ctx, kv, "B1", rec)
	if err != nil {
		t.Fatalf("create refused while the key was absent: %v", err)
	}
	rec.SettledBy = "H1"
	if _, err := store.Update(ctx, kv, "B1", rec, rev); err != nil {
		t.Fatalf("update refused while the key was unchanged: %v", err)
	}
	if kv.creates.Load() != 2 || kv.updates.Load() != 2 {
		t.Fatalf("%d creates, %d updates: the refusals were not retried", kv.creates.Load(), kv.updates.Load())
	}
	rec.SettledBy = "H2"
	if _, err := store.Update(ctx, kv, "B1", rec, rev); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("update at a stale revision = %v, want ErrConflict", err)
	}
}

// lostOrBusy is a bucket whose first write's answer is lost (the write
// landing or not, by land) and, when it did not land, whose second write
// is refused as in flight (10164), as a cluster answers around an election.
type lostOrBusy struct {
	jetstream.KeyValue
	land   bool
	writes atomic.Int32
}

func (k *lostOrBusy) write(ctx context.Context, do func(context.Context) (uint64, error)) (uint64, error) {
	switch n := k.writes.Add(1); {
	case n == 1 && k.land:
		_, _ = do(context.WithoutCancel(ctx))
		return 0, context.DeadlineExceeded
	case n == 1:
		return 0, context.DeadlineExceeded
	case n == 2 && !k.land:
		return 0, errInFlight
	}
	return do(ctx)
}

func (k *lostOrBusy) Update(ctx context.Context, key string, v []byte, last uint64) (uint64, error) {
	return k.write(ctx, func(ctx context.Context) (uint64, error) { return k.KeyValue.Update(ctx, key, v, last) })
}

func (k *lostOrBusy) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	_, err := k.write(ctx, func(ctx context.Context) (uint64, error) { return 0, k.KeyValue.Delete(ctx, key, opts...) })
	return err
}

// TestStaleLeaderReadIsNoConflict: a refused compare-and-set is decided by
// reading the key from the leader, and a leader that has not applied the
// revision the write expects (it has no message for the key: one just
// elected, or a deposed one answering after a partition healed) is no
// evidence: the write is tried again. Before, a claim whose first attempt
// landed unanswered was reported as lost to another party (ErrConflict), and
// its host forgot a run whose record names it as host (make test's chaos seed
// 1: an epoch running for good, claimed by a live host, I6); and a delete
// that never landed was reported done.
func TestStaleLeaderReadIsNoConflict(t *testing.T) {
	s := testutil.Server(t)
	st := testutil.Store(t, testutil.Connect(t, s.ClientURL()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		land bool // the unanswered first attempt landed
		op   func(kv jetstream.KeyValue, key string, rec protocol.RunRecord, rev uint64) error
		// check is what the key must hold once op succeeded.
		check func(t *testing.T, key string, rec protocol.RunRecord)
	}{
		{"update whose first attempt landed", true,
			func(kv jetstream.KeyValue, key string, rec protocol.RunRecord, rev uint64) error {
				_, err := store.Update(ctx, kv, key, rec, rev)
				return err
			},
			func(t *testing.T, key string, rec protocol.RunRecord) {
				got, err := store.Get[protocol.RunRecord](ctx, st.Runs, key)
				if err != nil || got.Value.HostID != rec.HostID {
					t.Fatalf("the key holds %+v, %v; want the update", got.Value, err)
				}
			}},
		{"delete that had not landed", false,
			func(kv jetstream.KeyValue, key string, _ protocol.RunRecord, rev uint64) error {
				return store.Delete(ctx, kv, key, rev)
			},
			func(t *testing.T, key string, _ protocol.RunRecord) {
				if _, err := store.Get[protocol.RunRecord](ctx, st.Runs, key); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("the key = %v, want deleted", err)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "S" + fmt.Sprint(tc.land)
			rec := protocol.RunRecord{RunID: key, State: protocol.RunRunning}
			rev, err := store.Create(ctx, st.Runs, key, rec)
			if err != nil {
				t.Fatal(err)
			}
			writes := &lostOrBusy{KeyValue: st.Runs, land: tc.land}
			rec.HostID = "H1"
			if err := tc.op(store.StaleReads(writes, st.Runs, 1), key, rec, rev); err != nil {
				t.Fatalf("= %v; a leader not yet at revision %d is no conflict", err, rev)
			}
			tc.check(t, key, rec)
		})
	}
}
