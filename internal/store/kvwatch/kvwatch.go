// Package kvwatch keeps a cache of one KV bucket current through a watch
// (docs/architecture.md §6): the coordinator's caches of brood_hosts,
// brood_agents and brood_runs each apply what one Watch delivers. It holds
// no bucket: the store opens the watch (store.Store.WatchHosts,
// WatchAgents, WatchRuns), so no package outside internal/store holds a
// bucket handle (issue 31, item 3).
package kvwatch

import (
	"container/heap"
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Watch keeps a cache of one KV bucket current through a watch (an ordered
// consumer), in stream order: apply gets every key's value, then every change.
// Each key's revision is applied at most once, so values the watch delivers
// again after a restart are not news. The watch can be restarted (Restart);
// after a restart the keys that disappeared meanwhile are applied as deleted.
//
// A key whose value lapses (a per-message TTL, or the bucket's max age, as
// put reports it) is applied as deleted once it lapsed, kvLapseSlack after
// its lifetime: the server removes such a key without writing anything a
// watch could deliver, since our buckets have no subject delete markers
// (they need roll-ups, which no bucket allows: store.streamConfigs), so the
// watch would otherwise hold it until it restarts, one entry per key ever
// seen (issue 12, point 5). A restart would find it gone the same way.
//
// Why restart by hand: after a server restart the client's ordered consumer
// notices that its consumer is gone only by missing idle heartbeats (nats.go
// checks every 2 × 5 s), and recreating it can fail while JetStream recovers,
// so the watch can stay silent for half a minute. A coordinator finds out
// sooner from its own heartbeat: written, but not delivered back
// (hostreg.Registry.Stalled).
type Watch struct {
	open Opener
	name string
	log  *slog.Logger
	// put applies key's value e and returns how long after e.Created()
	// the server removes it (its TTL, the bucket's max age; 0: never by
	// itself); del applies key as deleted.
	put   func(key string, e jetstream.KeyValueEntry) (lapse time.Duration)
	del   func(key string)
	ready chan struct{} // closed once the first snapshot was applied
	again chan struct{} // restart requests

	// revs holds the revision applied per key the bucket holds, as far as
	// the watch knows: one entry per key, removed when its delete comes,
	// when its value lapses (lapses) or when a restart finds it gone.
	// Bound: the keys the bucket holds (for brood_runs, two per run not
	// settled or settled within RunsMaxAge; BENCHMARKS.md, session 11).
	revs map[string]uint64
	// lapses holds the keys of revs whose value lapses, by key and ordered
	// by when (lapseOrder, a heap): at most one per key of revs.
	lapses     map[string]*lapse
	lapseOrder lapseHeap
	// keys is len(revs), readable from any goroutine (tests, benchmarks).
	keys atomic.Int64

	// applied is the highest revision the watch delivered and applied (a
	// put or a delete); advanced is closed, and replaced, when it grows
	// (WaitApplied).
	appliedMu sync.Mutex
	applied   uint64
	advanced  chan struct{}
}

// Opener opens a watch of every key of one bucket, current values first,
// then every change (jetstream.KeyValue.WatchAll): store.Store.WatchHosts,
// WatchAgents or WatchRuns.
type Opener func(ctx context.Context) (jetstream.KeyWatcher, error)

// New returns the watch of the bucket open opens (name names it in logs
// and errors); put and del apply its changes (see Watch). Run runs it.
func New(open Opener, name string, log *slog.Logger, put func(string, jetstream.KeyValueEntry) time.Duration, del func(string)) *Watch {
	return &Watch{open: open, name: name, log: log, put: put, del: del,
		ready: make(chan struct{}), again: make(chan struct{}, 1), revs: map[string]uint64{}, lapses: map[string]*lapse{}, advanced: make(chan struct{})}
}

// kvLapseSlack is how long after a value's lifetime (its Created time, the
// server's clock, plus its TTL or max age) the watch applies its key as
// deleted: the server's expiry runs on a timer of its own, and clocks
// differ. Applied a little early, a key still there is only news again to
// a restarted watch, which finds it; a rewrite has a new revision anyway.
const kvLapseSlack = 2 * time.Second

// kvLapseSweep is how often the watch looks for lapsed keys.
const kvLapseSweep = time.Second

// lapse is one key of Watch.lapses: its value at rev lapses at at.
type lapse struct {
	key string
	rev uint64
	at  time.Time
	i   int // its index in lapseOrder
}

// lapseHeap orders lapses by time (container/heap).
type lapseHeap []*lapse

func (h lapseHeap) Len() int { return len(h) }

func (h lapseHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }

func (h lapseHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].i, h[j].i = i, j }

func (h *lapseHeap) Push(x any) { l := x.(*lapse); l.i = len(*h); *h = append(*h, l) }

func (h *lapseHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return l
}

// setLapse files key, applied at rev, to lapse at at; a zero at: it does
// not lapse (any earlier filing is dropped).
func (w *Watch) setLapse(key string, rev uint64, at time.Time) {
	l, ok := w.lapses[key]
	switch {
	case at.IsZero():
		if ok {
			heap.Remove(&w.lapseOrder, l.i)
			delete(w.lapses, key)
		}
	case ok:
		l.rev, l.at = rev, at
		heap.Fix(&w.lapseOrder, l.i)
	default:
		l = &lapse{key: key, rev: rev, at: at}
		heap.Push(&w.lapseOrder, l)
		w.lapses[key] = l
	}
}

// lapseDue applies as deleted the keys whose value lapsed by now.
func (w *Watch) lapseDue(now time.Time) {
	for len(w.lapseOrder) > 0 && !w.lapseOrder[0].at.After(now) {
		l := heap.Pop(&w.lapseOrder).(*lapse)
		delete(w.lapses, l.key)
		if rev, ok := w.revs[l.key]; ok && rev == l.rev {
			w.forget(l.key)
		}
	}
}

// forget applies key as deleted and drops what the watch holds of it.
func (w *Watch) forget(key string) {
	delete(w.revs, key)
	w.setLapse(key, 0, time.Time{})
	w.keys.Store(int64(len(w.revs)))
	w.del(key)
}

// Restart asks Run to replace the watch with a new one (non-blocking).
func (w *Watch) Restart() {
	select {
	case w.again <- struct{}{}:
	default:
	}
}

// kvWatchRetry is how long Run waits before opening a watch again after
// opening one failed (the server is down or JetStream recovering).
const kvWatchRetry = 250 * time.Millisecond

// kvWatchInitialMax bounds how long a new watch may take to deliver the
// bucket's current values; a slower one is opened again (its consumer may
// have been created while the stream was still electing a leader).
const kvWatchInitialMax = 10 * time.Second

// Run watches until ctx is done, opening the watch again whenever it ends or
// Restart is called; onRestart (optional) is called before each new watch.
func (w *Watch) Run(ctx context.Context, onRestart func()) {
	for first := true; ctx.Err() == nil; first = false {
		if !first && onRestart != nil {
			onRestart()
		}
		wctx, cancel := context.WithCancel(ctx)
		kw, err := w.open(wctx)
		if err != nil {
			cancel()
			if ctx.Err() == nil {
				w.log.Warn("KV watch could not be opened; retrying", "bucket", w.name, "err", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(kvWatchRetry):
			}
			continue
		}
		w.consume(ctx, kw)
		_ = kw.Stop()
		cancel()
	}
}

// consume applies one watch's updates until it ends, ctx is done or a
// restart is requested.
func (w *Watch) consume(ctx context.Context, kw jetstream.KeyWatcher) {
	snapshot := map[string]bool{} // keys of the initial values; nil once they are in
	initial := time.NewTimer(kvWatchInitialMax)
	defer initial.Stop()
	sweep := time.NewTicker(kvLapseSweep)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-initial.C:
			if snapshot != nil {
				w.log.Warn("KV watch delivered no complete snapshot in time; opening it again", "bucket", w.name, "bound", kvWatchInitialMax.String())
				return
			}
		case <-w.again:
			w.log.Info("restarting a KV watch", "bucket", w.name)
			return
		case now := <-sweep.C:
			w.lapseDue(now)
		case e, ok := <-kw.Updates():
			if !ok {
				w.log.Warn("KV watch ended; opening it again", "bucket", w.name)
				return
			}
			if e == nil { // the initial values are in
				if snapshot == nil {
					continue
				}
				for key := range w.revs {
					if !snapshot[key] { // gone while the previous watch was silent
						w.forget(key)
					}
				}
				snapshot = nil
				select {
				case <-w.ready:
				default:
					close(w.ready)
				}
				continue
			}
			key := e.Key()
			if snapshot != nil {
				snapshot[key] = e.Operation() == jetstream.KeyValuePut
			}
			if rev, ok := w.revs[key]; ok && e.Revision() <= rev {
				continue // delivered again after a restart: not news
			}
			if e.Operation() == jetstream.KeyValuePut {
				w.revs[key] = e.Revision()
				w.keys.Store(int64(len(w.revs)))
				var at time.Time
				if d := w.put(key, e); d > 0 {
					at = e.Created().Add(d + kvLapseSlack)
				}
				w.setLapse(key, e.Revision(), at)
			} else if _, ok := w.revs[key]; ok {
				w.forget(key)
			}
			w.advance(e.Revision())
		}
	}
}

// advance records that the watch applied revision rev.
func (w *Watch) advance(rev uint64) {
	w.appliedMu.Lock()
	defer w.appliedMu.Unlock()
	if rev > w.applied {
		w.applied = rev
		close(w.advanced)
		w.advanced = make(chan struct{})
	}
}

// WaitApplied waits until the watch applied revision rev of the bucket (a
// revision the caller wrote), so the cache holds every key written before
// it, as of then or later: the bucket's revisions are its stream's
// sequence, and the watch delivers them in order. It reports false when
// ctx ended first.
func (w *Watch) WaitApplied(ctx context.Context, rev uint64) bool {
	for {
		w.appliedMu.Lock()
		done, ch := w.applied >= rev, w.advanced
		w.appliedMu.Unlock()
		if done {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-ch:
		}
	}
}

// Ready is closed once the first snapshot of the bucket was applied.
func (w *Watch) Ready() <-chan struct{} { return w.ready }

// Name names the watched bucket (New's name).
func (w *Watch) Name() string { return w.name }

// Keys is how many keys the watch holds (its revs), readable from any
// goroutine (tests, benchmarks).
func (w *Watch) Keys() int64 { return w.keys.Load() }
