package kvwatch

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// entry is a KV entry as a watch delivers it.
type entry struct {
	key string
	val []byte
	rev uint64
	op  jetstream.KeyValueOp
}

func (e entry) Bucket() string                  { return "test" }
func (e entry) Key() string                     { return e.key }
func (e entry) Value() []byte                   { return e.val }
func (e entry) Revision() uint64                { return e.rev }
func (e entry) Created() time.Time              { return time.Time{} }
func (e entry) Delta() uint64                   { return 0 }
func (e entry) Operation() jetstream.KeyValueOp { return e.op }

// fakeWatcher is a KeyWatcher fed by the test.
type fakeWatcher struct{ ch chan jetstream.KeyValueEntry }

func (f *fakeWatcher) Updates() <-chan jetstream.KeyValueEntry { return f.ch }

func (f *fakeWatcher) Stop() error { return nil }

// TestKVWatchAppliesEachRevisionOnce: values a restarted watch delivers
// again are not news, and keys that vanished while the previous watch was
// silent are applied as deleted.
func TestKVWatchAppliesEachRevisionOnce(t *testing.T) {
	var applied []string
	w := New(nil, "test", slog.Default(),
		func(key string, e jetstream.KeyValueEntry) time.Duration {
			applied = append(applied, "put "+key+"@"+string(e.Value()))
			return 0
		},
		func(key string) { applied = append(applied, "del "+key) })
	feed := func(es ...jetstream.KeyValueEntry) {
		fw := &fakeWatcher{ch: make(chan jetstream.KeyValueEntry, len(es))}
		for _, e := range es {
			fw.ch <- e
		}
		close(fw.ch)
		w.consume(context.Background(), fw)
	}
	feed(entry{key: "a", val: []byte("1"), rev: 1}, entry{key: "b", val: []byte("1"), rev: 2}, nil,
		entry{key: "a", val: []byte("2"), rev: 3})
	select {
	case <-w.ready:
	default:
		t.Fatal("not ready after the initial values")
	}
	// The restarted watch: a unchanged, b gone, c new.
	feed(entry{key: "a", val: []byte("2"), rev: 3}, entry{key: "c", val: []byte("1"), rev: 5}, nil,
		entry{key: "c", rev: 6, op: jetstream.KeyValueDelete})
	want := []string{"put a@1", "put b@1", "put a@2", "put c@1", "del b", "del c"}
	if strings.Join(applied, ",") != strings.Join(want, ",") {
		t.Fatalf("applied %v\nwant    %v", applied, want)
	}
	var keys []string
	for k := range w.revs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if strings.Join(keys, ",") != "a" {
		t.Fatalf("tracked keys %v", keys)
	}
}

// TestKVWatchForgetsKeysOnceTheirValueLapsed: a key whose value put
// reports lapsing (a TTL, a max age) is applied as deleted kvLapseSlack
// after its lifetime, unless a newer value came meanwhile; one written
// again without a lifetime, or never lapsing, stays. The server removes
// such keys without a delete a watch could deliver, so before, the watch
// held every one it had seen until it restarted.
func TestKVWatchForgetsKeysOnceTheirValueLapsed(t *testing.T) {
	t0 := time.Now()
	var applied []string
	w := New(nil, "test", slog.Default(),
		func(key string, e jetstream.KeyValueEntry) time.Duration {
			applied = append(applied, "put "+key)
			d, _ := time.ParseDuration(string(e.Value())) // the value is its lifetime
			return d
		},
		func(key string) { applied = append(applied, "del "+key) })
	fw := &fakeWatcher{ch: make(chan jetstream.KeyValueEntry, 16)}
	for _, e := range []jetstream.KeyValueEntry{
		created{entry{key: "short", val: []byte("1s"), rev: 1}, t0},
		created{entry{key: "long", val: []byte("1h"), rev: 2}, t0},
		created{entry{key: "never", val: []byte("0s"), rev: 3}, t0},
		created{entry{key: "renewed", val: []byte("1s"), rev: 4}, t0},
		created{entry{key: "kept", val: []byte("1s"), rev: 5}, t0},
		nil,
		created{entry{key: "renewed", val: []byte("1m"), rev: 6}, t0.Add(time.Second)},
		created{entry{key: "kept", val: []byte("0s"), rev: 7}, t0.Add(time.Second)},
	} {
		fw.ch <- e
	}
	close(fw.ch)
	w.consume(context.Background(), fw)
	for _, at := range []time.Duration{0, time.Second + kvLapseSlack, time.Minute, time.Minute + time.Second + kvLapseSlack} {
		w.lapseDue(t0.Add(at))
		applied = append(applied, fmt.Sprintf("%d keys", w.keys.Load()))
	}
	want := []string{"put short", "put long", "put never", "put renewed", "put kept", "put renewed", "put kept",
		"5 keys", "del short", "4 keys", "4 keys", "del renewed", "3 keys"}
	if strings.Join(applied, ",") != strings.Join(want, ",") {
		t.Fatalf("applied %v\nwant    %v", applied, want)
	}
	if len(w.lapses) != 1 || w.lapses["long"] == nil || len(w.lapseOrder) != 1 {
		t.Fatalf("lapsing keys %v (%d ordered), want long only", w.lapses, len(w.lapseOrder))
	}
}

// created is an entry written at a time.
type created struct {
	entry
	at time.Time
}

func (e created) Created() time.Time { return e.at }
