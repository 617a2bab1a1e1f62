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

	"github.com/brood-dev/brood/internal/testutil"
)

// entry is a KV entry as a watch delivers it.
type entry = testutil.KVEntry

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
	feed(entry{Name: "a", Data: []byte("1"), Rev: 1}, entry{Name: "b", Data: []byte("1"), Rev: 2}, nil,
		entry{Name: "a", Data: []byte("2"), Rev: 3})
	select {
	case <-w.ready:
	default:
		t.Fatal("not ready after the initial values")
	}
	// The restarted watch: a unchanged, b gone, c new.
	feed(entry{Name: "a", Data: []byte("2"), Rev: 3}, entry{Name: "c", Data: []byte("1"), Rev: 5}, nil,
		entry{Name: "c", Rev: 6, Op: jetstream.KeyValueDelete})
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
		created{entry{Name: "short", Data: []byte("1s"), Rev: 1}, t0},
		created{entry{Name: "long", Data: []byte("1h"), Rev: 2}, t0},
		created{entry{Name: "never", Data: []byte("0s"), Rev: 3}, t0},
		created{entry{Name: "renewed", Data: []byte("1s"), Rev: 4}, t0},
		created{entry{Name: "kept", Data: []byte("1s"), Rev: 5}, t0},
		nil,
		created{entry{Name: "renewed", Data: []byte("1m"), Rev: 6}, t0.Add(time.Second)},
		created{entry{Name: "kept", Data: []byte("0s"), Rev: 7}, t0.Add(time.Second)},
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
