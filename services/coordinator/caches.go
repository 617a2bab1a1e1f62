package coordinator

import (
	"container/heap"
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// kvWatch keeps a cache of one KV bucket current through a watch (an ordered
// consumer), in stream order: apply gets every key's value, then every change.
// Each key's revision is applied at most once, so values the watch delivers
// again after a restart are not news. The watch can be restarted (restart);
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
// (registry.stalled).
type kvWatch struct {
	kv   jetstream.KeyValue
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
}

func newKVWatch(kv jetstream.KeyValue, name string, log *slog.Logger, put func(string, jetstream.KeyValueEntry) time.Duration, del func(string)) *kvWatch {
	return &kvWatch{kv: kv, name: name, log: log, put: put, del: del,
		ready: make(chan struct{}), again: make(chan struct{}, 1), revs: map[string]uint64{}, lapses: map[string]*lapse{}}
}

// kvLapseSlack is how long after a value's lifetime (its Created time, the
// server's clock, plus its TTL or max age) the watch applies its key as
// deleted: the server's expiry runs on a timer of its own, and clocks
// differ. Applied a little early, a key still there is only news again to
// a restarted watch, which finds it; a rewrite has a new revision anyway.
const kvLapseSlack = 2 * time.Second

// kvLapseSweep is how often the watch looks for lapsed keys.
const kvLapseSweep = time.Second

// lapse is one key of kvWatch.lapses: its value at rev lapses at at.
type lapse struct {
	key string
	rev uint64
	at  time.Time
	i   int // its index in lapseOrder
}

// lapseHeap orders lapses by time (container/heap).
type lapseHeap []*lapse

func (h lapseHeap) Len() int           { return len(h) }
func (h lapseHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h lapseHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].i, h[j].i = i, j }
func (h *lapseHeap) Push(x any)        { l := x.(*lapse); l.i = len(*h); *h = append(*h, l) }
func (h *lapseHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return l
}

// setLapse files key, applied at rev, to lapse at at; a zero at: it does
// not lapse (any earlier filing is dropped).
func (w *kvWatch) setLapse(key string, rev uint64, at time.Time) {
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
func (w *kvWatch) lapseDue(now time.Time) {
	for len(w.lapseOrder) > 0 && !w.lapseOrder[0].at.After(now) {
		l := heap.Pop(&w.lapseOrder).(*lapse)
		delete(w.lapses, l.key)
		if rev, ok := w.revs[l.key]; ok && rev == l.rev {
			w.forget(l.key)
		}
	}
}

// forget applies key as deleted and drops what the watch holds of it.
func (w *kvWatch) forget(key string) {
	delete(w.revs, key)
	w.setLapse(key, 0, time.Time{})
	w.keys.Store(int64(len(w.revs)))
	w.del(key)
}

// restart asks run to replace the watch with a new one (non-blocking).
func (w *kvWatch) restart() {
	select {
	case w.again <- struct{}{}:
	default:
	}
}

// kvWatchRetry is how long run waits before opening a watch again after
// opening one failed (the server is down or JetStream recovering).
const kvWatchRetry = 250 * time.Millisecond

// kvWatchInitialMax bounds how long a new watch may take to deliver the
// bucket's current values; a slower one is opened again (its consumer may
// have been created while the stream was still electing a leader).
const kvWatchInitialMax = 10 * time.Second

// run watches until ctx is done, opening the watch again whenever it ends or
// restart is called.
func (w *kvWatch) run(ctx context.Context, onRestart func()) {
	for first := true; ctx.Err() == nil; first = false {
		if !first && onRestart != nil {
			onRestart()
		}
		wctx, cancel := context.WithCancel(ctx)
		kw, err := w.kv.WatchAll(wctx)
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
func (w *kvWatch) consume(ctx context.Context, kw jetstream.KeyWatcher) {
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
		}
	}
}

// hostState is one host as this coordinator last saw it.
type hostState struct {
	rec protocol.HostRecord
	// obs is the observed clock (registry.obs) when its latest heartbeat
	// reached this coordinator.
	obs time.Duration
	// rev is the bucket revision of rec: a record delivered again (a
	// watch opened again) or read from the leader already is not news.
	rev uint64
}

// registry is the provider registry, derived from the records in brood_hosts
// (docs/design.md §4): a provider exists while at least one live, non-draining
// host offers it; instances must have equal descriptors (the
// earliest-started instance defines it; a conflicting one is ignored).
//
// Liveness is judged on evidence about the host only (shared/RELIABILITY.md;
// docs/design.md §14): a host is dead once this coordinator has watched the
// bucket, provably current, for longer than the expiry without seeing a
// heartbeat from it. The proof is the coordinator's own heartbeat: the watch
// delivers in stream order, so when our own record written at time t comes
// back, every heartbeat any host stored before t has come back too. The
// observed clock (obs) advances by the time between two consecutive own
// heartbeats that came back, and stands still while they do not: while this
// coordinator is cut off, paused, or its watch is restarting or cannot read
// the bucket. A gap longer than gapMax between two own heartbeats is not
// counted either (the server itself may have been down: nobody could write),
// and a host's silence counts only from the latest such gap, so a host gets
// the whole expiry of observed time after it. A host is dead when more than
// the expiry of observed time passed since its latest heartbeat (or the
// latest gap) came back; a new heartbeat from it makes it live again.
type registry struct {
	mu sync.Mutex
	// hosts holds the hosts whose record brood_hosts holds, by host id:
	// removed when a host's record is deleted (a host that stops) or lapses
	// (maxAge after its latest heartbeat, kvWatch). Bound: the live hosts
	// and those silent for less than maxAge (store.Config.HostsMaxAge,
	// 10 min by default).
	hosts map[string]*hostState
	// maxAge is brood_hosts' max age (store.Config.HostsMaxAge; 0: none).
	maxAge   time.Duration
	self     string
	expiry   time.Duration
	gapMax   time.Duration
	staleMax time.Duration
	log      *slog.Logger

	obs      time.Duration // the observed clock
	gapObs   time.Duration // the observed clock at the latest gap
	ownIssue int64         // issue time (ms) of the latest own heartbeat delivered
	ownRev   uint64        // its revision
	// unconfirmed is when the oldest own heartbeat written but not yet
	// delivered back was written (zero: none); wroteRev its revision.
	unconfirmed time.Time
	wroteRev    uint64
}

// newRegistry returns the registry of the coordinator self, which heartbeats
// every interval; hosts expire after expiry of observed time.
func newRegistry(self string, interval, expiry time.Duration, log *slog.Logger) *registry {
	return &registry{
		hosts: map[string]*hostState{}, self: self, expiry: expiry, log: log,
		gapMax:   max(expiry/2, interval*3/2),
		staleMax: max(3*interval, 2*time.Second),
	}
}

// put applies host key's record e; it lapses after the bucket's max age
// (kvWatch).
func (r *registry) put(key string, e jetstream.KeyValueEntry) time.Duration {
	rec, err := store.Decode[protocol.HostRecord](e)
	if err != nil {
		r.log.Warn("undecodable host record", "host", key, "err", err)
		return r.maxAge
	}
	if rec.HostID != key {
		r.log.Warn("host record under another host's key ignored", "key", key, "hostId", rec.HostID)
		return r.maxAge
	}
	rec.Providers = inScope(key, rec.Providers, r.log)
	r.mu.Lock()
	defer r.mu.Unlock()
	if key == r.self {
		r.ownBeat(rec.Heartbeat, e.Revision())
	}
	if h, ok := r.hosts[key]; ok && h.rev >= e.Revision() {
		return r.maxAge // applied already (confirm read it from the leader first)
	}
	r.hosts[key] = &hostState{rec: rec, obs: r.obs, rev: e.Revision()}
	return r.maxAge
}

// confirm applies rec, host key's record at revision rev as the bucket's
// leader answered it, when the registry holds an older revision of it or
// none: a heartbeat its watch did not deliver (a watch silent or opened
// again through an election, a snapshot without the key). It reports
// whether the host is live afterwards: a record newer than the registry's
// makes it live from now on the observed clock; the same one leaves the
// judgement as it was. A record filed under another host's key is not
// applied (and proves nothing of key).
func (r *registry) confirm(key string, rec protocol.HostRecord, rev uint64) bool {
	if rec.HostID != key {
		return false
	}
	rec.Providers = inScope(key, rec.Providers, r.log)
	r.mu.Lock()
	defer r.mu.Unlock()
	if h, ok := r.hosts[key]; ok && h.rev >= rev {
		return r.liveLocked(h)
	}
	r.hosts[key] = &hostState{rec: rec, obs: r.obs, rev: rev}
	return true
}

// inScope returns the descriptors host may offer (protocol.MayOffer): a
// worker may write only its own scope's host records (docs/security.md), so
// a descriptor of another provider there is a forgery, left out of the
// registry and of dispatch.
func inScope(host string, ds []protocol.ProviderDescriptor, log *slog.Logger) []protocol.ProviderDescriptor {
	out := ds[:0:0]
	for _, d := range ds {
		if protocol.MayOffer(host, d.Name) {
			out = append(out, d)
		} else {
			log.Warn("a provider offered outside its host's scope ignored", "host", host, "provider", d.Name)
		}
	}
	return out
}

// ownBeat advances the observed clock with an own heartbeat that came back.
func (r *registry) ownBeat(issueMs int64, rev uint64) {
	if d := time.Duration(issueMs-r.ownIssue) * time.Millisecond; r.ownIssue != 0 && d > 0 && d <= r.gapMax {
		r.obs += d
	} else {
		r.gapObs = r.obs // a gap (or the first heartbeat): every silence starts again here
	}
	r.ownIssue, r.ownRev = issueMs, rev
	if rev >= r.wroteRev {
		r.unconfirmed = time.Time{}
	}
}

// wrote records an own heartbeat that JetStream acknowledged at rev.
func (r *registry) wrote(rev uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rev <= r.ownRev {
		return
	}
	if r.unconfirmed.IsZero() {
		r.unconfirmed = time.Now()
	}
	r.wroteRev = max(r.wroteRev, rev)
}

// stalled reports whether an own heartbeat JetStream acknowledged more than
// staleMax ago has not come back through the watch: the watch is silent and
// must be opened again. It resets the wait, so a restart is asked for once.
func (r *registry) stalled() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unconfirmed.IsZero() || time.Since(r.unconfirmed) <= r.staleMax {
		return false
	}
	r.unconfirmed = time.Time{}
	return true
}

func (r *registry) del(key string) {
	r.mu.Lock()
	delete(r.hosts, key)
	r.mu.Unlock()
}

// observed returns the observed clock.
func (r *registry) observed() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.obs
}

// expired reports whether more than the expiry of observed time passed
// since since, in one stretch without a gap.
func (r *registry) expired(since time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.expiredLocked(since)
}

func (r *registry) expiredLocked(since time.Duration) bool {
	return r.obs-max(since, r.gapObs) > r.expiry
}

func (r *registry) liveLocked(h *hostState) bool {
	return !r.expiredLocked(h.obs)
}

// liveHosts reports the live hosts by kind (brood_hosts_live).
func (r *registry) liveHosts(add func(v float64, labels ...string)) {
	counts := map[string]int{protocol.HostWorker: 0, protocol.HostCoordinator: 0}
	r.mu.Lock()
	for _, h := range r.hosts {
		if r.liveLocked(h) {
			counts[h.rec.Kind]++
		}
	}
	r.mu.Unlock()
	for kind, n := range counts {
		add(float64(n), kind)
	}
}

// liveInstances reports the live instances of each provider
// (brood_provider_instances).
func (r *registry) liveInstances(add func(v float64, labels ...string)) {
	_, counts := r.providers()
	for name, n := range counts {
		add(float64(n), name)
	}
}

// hostLive reports whether host id is known and not judged dead.
func (r *registry) hostLive(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.hosts[id]
	return ok && r.liveLocked(h)
}

// hostKnown reports whether a record of host id exists, live or not.
func (r *registry) hostKnown(id string) (kind string, live, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.hosts[id]
	if !ok {
		return "", false, false
	}
	return h.rec.Kind, r.liveLocked(h), true
}

// providers returns the live providers sorted by name and their instance counts.
func (r *registry) providers() ([]protocol.ProviderDescriptor, map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	type inst struct {
		d       protocol.ProviderDescriptor
		started int64
		host    string
	}
	var all []inst
	for id, h := range r.hosts {
		if !r.liveLocked(h) || h.rec.Draining {
			continue
		}
		for _, d := range h.rec.Providers {
			all = append(all, inst{d, h.rec.StartedAt, id})
		}
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].started != all[j].started {
			return all[i].started < all[j].started
		}
		return all[i].host < all[j].host
	})
	byName := map[string]protocol.ProviderDescriptor{}
	counts := map[string]int{}
	for _, in := range all {
		first, ok := byName[in.d.Name]
		if !ok {
			byName[in.d.Name] = in.d
			counts[in.d.Name] = 1
			continue
		}
		if first.Equal(in.d) {
			counts[in.d.Name]++
		}
	}
	out := make([]protocol.ProviderDescriptor, 0, len(byName))
	for _, d := range byName {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, counts
}

// provider returns the live descriptor of name.
//
// It is the descriptor providers would list for name (the one of the live,
// not draining host that started first, ties by host id), found without
// building the whole list: every start asks it (issue 12's profile: 7 µs of
// a run's coordinator CPU sorted and mapped every provider for one).
func (r *registry) provider(name string) (protocol.ProviderDescriptor, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var (
		best      protocol.ProviderDescriptor
		bestStart int64
		bestHost  string
		found     bool
	)
	for id, h := range r.hosts {
		if !r.liveLocked(h) || h.rec.Draining {
			continue
		}
		for _, d := range h.rec.Providers {
			if d.Name != name {
				continue
			}
			if !found || h.rec.StartedAt < bestStart || (h.rec.StartedAt == bestStart && id < bestHost) {
				best, bestStart, bestHost, found = d, h.rec.StartedAt, id, true
			}
			break
		}
	}
	return best, found
}

// leaseState is one lease as this coordinator last saw it.
type leaseState struct {
	rec       protocol.AgentRecord
	rev       uint64
	firstSeen time.Time
	// firstObs is the registry's observed clock when the lease was first
	// seen: a holder never seen heartbeating is judged from then.
	firstObs time.Duration
}

// agentIndex caches brood_agents (leases): credentials for authority checks,
// and the sessions of each host and each parent for takeovers and disposal.
type agentIndex struct {
	mu sync.Mutex
	// byKey holds the leases by brood_agents key (store.LeaseKeyOf), drains
	// the drain markers by scope: removed when their key is deleted (a run
	// or epoch ended, a drain lifted); bound: the live sessions (each holds
	// at most one lease) and the drains in force.
	byKey  map[string]*leaseState
	drains map[string]protocol.DrainRecord
	// ended holds the sessions whose lease this replica saw and then saw
	// deleted (a run settled, an epoch ended), until a lease of theirs
	// appears again: their live-children slot is free at once (slots.go).
	// endedRuns holds the run ids of those leases: a resumed epoch's slot
	// names its run, and is free once that run's lease went.
	ended     map[string]bool
	endedRuns map[string]bool
	// byParent indexes byKey by the leases' parent session (parent → keys;
	// a parent leaves with its last lease, so it holds no more than byKey),
	// so counting one parent's live children reads that parent's leases
	// only: with 10,000 children resident, a start that copied every lease
	// took 9.4 ms instead of 1.4 (make bench-scale).
	byParent map[string]map[string]struct{}
	clock    func() time.Duration // the registry's observed clock
	// belongs checks a child's lease seen under key against its session's
	// header (store.LeaseBelongs); nil: only the key is checked.
	belongs func(key string, rec protocol.AgentRecord) error
	log     *slog.Logger
}

// setLease stores l under key and keeps byParent in step; a.mu is held.
func (a *agentIndex) setLease(key string, l *leaseState) {
	if old, ok := a.byKey[key]; ok {
		a.unindex(key, old.rec.ParentSession)
	}
	a.byKey[key] = l
	if p := l.rec.ParentSession; p != "" {
		keys := a.byParent[p]
		if keys == nil {
			keys = map[string]struct{}{}
			a.byParent[p] = keys
		}
		keys[key] = struct{}{}
	}
}

// unindex removes key from parent's entry of byParent; a.mu is held.
func (a *agentIndex) unindex(key, parent string) {
	if keys := a.byParent[parent]; keys != nil {
		delete(keys, key)
		if len(keys) == 0 {
			delete(a.byParent, parent)
		}
	}
}

// childrenOf returns the cached leases whose parent session is parent.
func (a *agentIndex) childrenOf(parent string) []leaseState {
	a.mu.Lock()
	defer a.mu.Unlock()
	keys := a.byParent[parent]
	out := make([]leaseState, 0, len(keys))
	for k := range keys {
		out = append(out, *a.byKey[k])
	}
	return out
}

// endedMax bounds agentIndex.ended; past it the set starts over, which only
// lets the slots of the forgotten sessions wait out their grace.
const endedMax = 100_000

func newAgentIndex(clock func() time.Duration, belongs func(string, protocol.AgentRecord) error, log *slog.Logger) *agentIndex {
	return &agentIndex{byKey: map[string]*leaseState{}, drains: map[string]protocol.DrainRecord{},
		ended: map[string]bool{}, endedRuns: map[string]bool{}, byParent: map[string]map[string]struct{}{}, clock: clock, belongs: belongs, log: log}
}

// leaseHeaderWait bounds the header read that checks a child's lease the
// index sees for the first time (or naming another provider or parent than
// the last it saw under that key).
const leaseHeaderWait = 2 * time.Second

// hasEnded reports whether session id's lease was seen and then deleted,
// with no lease since.
func (a *agentIndex) hasEnded(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ended[id]
}

// hasEndedRun reports whether a lease of run runID was seen and then deleted.
func (a *agentIndex) hasEndedRun(runID string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.endedRuns[runID]
}

// put applies brood_agents key's value e. Of its keys only a user grant
// lapses by itself (store.CreateGrant's TTL): the time from e's creation
// to its expiry, plus the second CreateGrant rounds up (kvWatch).
func (a *agentIndex) put(key string, e jetstream.KeyValueEntry) time.Duration {
	kind, id := store.KindOf(key)
	switch kind {
	case store.KindDrain:
		if rec, err := store.Decode[protocol.DrainRecord](e); err == nil {
			a.mu.Lock()
			a.drains[id] = rec
			a.mu.Unlock()
		}
		return 0
	case store.KindGrant:
		if rec, err := store.Decode[protocol.UserGrantRecord](e); err == nil && rec.ExpiresAt > 0 {
			return max(time.UnixMilli(rec.ExpiresAt).Sub(e.Created()), 0) + time.Second
		}
		return 0
	case store.KindLease, store.KindRootLease:
	default:
		return 0 // ownership and slot records are read directly when needed
	}
	a.addLease(key, id, kind, e)
	return 0
}

// addLease applies the lease e under key (of session id, kind KindLease or
// KindRootLease).
func (a *agentIndex) addLease(key, id string, kind store.AgentsKind, e jetstream.KeyValueEntry) {
	rec, err := store.Decode[protocol.AgentRecord](e)
	if err != nil {
		a.log.Warn("undecodable agent record", "session", key, "err", err)
		return
	}
	// A root's lease lives only under its root key, which only coordinators
	// write, and a child's under its provider's prefix, which only that
	// provider's workers write; a lease elsewhere (naming a root, another
	// session or another provider) is not that session's (docs/security.md).
	if key != store.LeaseKeyOf(rec) {
		a.log.Warn("a lease under another key ignored", "key", key, "session", rec.SessionID, "kind", rec.Kind, "provider", rec.Provider)
		return
	}
	// A child's lease must also agree with its session's header, which only
	// coordinators write: a worker may write its own provider's leases, and
	// what it writes there for a session of another provider, or naming
	// another parent (counted against that parent's live children,
	// disposed with its tree), is no lease. A header that cannot be read
	// now is no evidence: the lease is kept (readers that act on one lease
	// read it again, checked, from the store).
	a.mu.Lock()
	old, seen := a.byKey[key]
	a.mu.Unlock()
	if a.belongs != nil && kind == store.KindLease && (!seen || old.rec.Provider != rec.Provider || old.rec.ParentSession != rec.ParentSession) {
		if err := a.belongs(key, rec); errors.Is(err, store.ErrMisfiledLease) {
			a.log.Warn("a lease its session's header disowns ignored", "key", key, "err", err)
			a.mu.Lock()
			if old, ok := a.byKey[key]; ok {
				delete(a.byKey, key)
				a.unindex(key, old.rec.ParentSession)
			}
			a.mu.Unlock()
			return
		} else if err != nil {
			a.log.Warn("a lease kept unchecked: its session's header could not be read", "key", key, "err", err)
		}
	}
	obs := a.clock()
	a.mu.Lock()
	defer a.mu.Unlock()
	l := &leaseState{rec: rec, rev: e.Revision(), firstSeen: time.Now(), firstObs: obs}
	if old, ok := a.byKey[key]; ok {
		l.firstSeen, l.firstObs = old.firstSeen, old.firstObs
	}
	a.setLease(key, l)
	delete(a.ended, id)
}

// del forgets the lease (or drain marker) under brood_agents key key
// (store.LeaseKeyOf of a lease), as a watched delete does.
func (a *agentIndex) del(key string) {
	kind, id := store.KindOf(key)
	a.mu.Lock()
	switch kind {
	case store.KindDrain:
		delete(a.drains, id)
	case store.KindLease, store.KindRootLease:
		old, ok := a.byKey[key]
		if !ok {
			break
		}
		delete(a.byKey, key)
		a.unindex(key, old.rec.ParentSession)
		if len(a.ended) >= endedMax {
			a.ended = map[string]bool{}
		}
		if len(a.endedRuns) >= endedMax {
			a.endedRuns = map[string]bool{}
		}
		a.ended[id] = true
		if old.rec.RunID != "" {
			a.endedRuns[old.rec.RunID] = true
		}
	}
	a.mu.Unlock()
}

// drainMarks returns the drain markers in force (scope → record).
func (a *agentIndex) drainMarks() map[string]protocol.DrainRecord {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]protocol.DrainRecord, len(a.drains))
	for k, v := range a.drains {
		out[k] = v
	}
	return out
}

// get returns the cached lease of session id of scope (its header's,
// protocol.SessionHeader.Scope): a root's lease is read only from its root
// key, a child's only from its provider's.
func (a *agentIndex) get(id, scope string) (leaseState, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.byKey[store.LeaseKeyFor(id, scope)]
	if !ok {
		return leaseState{}, false
	}
	return *l, true
}

// observe stores a fresher lease read directly from the bucket.
func (a *agentIndex) observe(rec protocol.AgentRecord, rev uint64) {
	obs := a.clock()
	a.mu.Lock()
	defer a.mu.Unlock()
	l := &leaseState{rec: rec, rev: rev, firstSeen: time.Now(), firstObs: obs}
	key := store.LeaseKeyOf(rec)
	if old, ok := a.byKey[key]; ok {
		if old.rev >= rev {
			return
		}
		l.firstSeen, l.firstObs = old.firstSeen, old.firstObs
	}
	a.setLease(key, l)
}

// snapshot returns every cached lease.
func (a *agentIndex) snapshot() []leaseState {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]leaseState, 0, len(a.byKey))
	for _, l := range a.byKey {
		out = append(out, *l)
	}
	return out
}

// boundedMap is a map of at most max entries, for values that can be read
// again: adding to a full one evicts an arbitrary entry.
type boundedMap[V any] struct {
	mu  sync.Mutex
	m   map[string]V
	max int
}

func newBoundedMap[V any](max int) boundedMap[V] { return boundedMap[V]{m: map[string]V{}, max: max} }

func (b *boundedMap[V]) get(k string) (V, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.m[k]
	return v, ok
}

func (b *boundedMap[V]) add(k string, v V) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.m) >= b.max {
		for old := range b.m {
			delete(b.m, old)
			break
		}
	}
	b.m[k] = v
}

// headerCache keeps immutable session headers (at most
// Config.HeadersCachedMax; a miss reads BROOD_SESSIONS).
type headerCache struct {
	// verify, when set, refuses a header read from the stream before it is
	// cached (Coordinator.verifyHeader).
	verify func(protocol.SessionHeader) error
	boundedMap[protocol.SessionHeader]
}

func (c *headerCache) get(ctx context.Context, st *store.Store, id string) (protocol.SessionHeader, error) {
	if h, ok := c.boundedMap.get(id); ok {
		return h, nil
	}
	h, err := st.GetHeader(ctx, id)
	if err != nil {
		return h, err
	}
	if c.verify != nil {
		if err := c.verify(h); err != nil {
			return protocol.SessionHeader{}, err
		}
	}
	c.add(h)
	return h, nil
}

// verifyHeader refuses the header of a live root that is not the one its
// lease records (AgentRecord.HeaderDigest, or its user for a lease written
// before the digest): the lease only coordinators write, the header one
// the collector may purge and publish again (issue 29, item 3;
// docs/security.md, "A collector"). Every other header passes: a child's
// owner is its root's, and a closed root has no lease to compare with.
func (c *Coordinator) verifyHeader(h protocol.SessionHeader) error {
	if h.Scope() != protocol.ScopeRoot {
		return nil
	}
	l, ok := c.agents.get(h.ID, protocol.ScopeRoot)
	if !ok || l.rec.Kind != protocol.AgentRoot || l.rec.SessionID != h.ID {
		return nil
	}
	forged := l.rec.User != h.User
	if l.rec.HeaderDigest != "" {
		forged = l.rec.HeaderDigest != protocol.HeaderDigest(h)
	}
	if !forged {
		return nil
	}
	c.log.Error("a live root's header is not the one its coordinator wrote (purged and published again?); refusing it", "session", h.ID, "headerUser", h.User, "leaseUser", l.rec.User)
	return protocol.Errorf(protocol.CodeUnavailable, "the header of root %s is not the one its coordinator wrote; the tree is refused until an operator restores it (docs/security.md, \"A collector\")", h.ID)
}

func (c *headerCache) add(h protocol.SessionHeader) { c.boundedMap.add(h.ID, h) }

// descriptorCache keeps the descriptors of continuable children whose
// provider is local, by child id (at most Config.HeadersCachedMax; a miss
// reads the log's head). A child's descriptor never changes: cold resume
// folds the first one of its own events (sessionlog.Descriptor), so a
// cached one stays right.
type descriptorCache struct {
	boundedMap[protocol.DescriptorData]
}
