package coordinator

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// watchBucket feeds every value of kv, then every change, to put/del until ctx
// is done. ready is closed once the initial values were delivered. Initial
// values report the server's write time; later ones the local arrival time.
func watchBucket(ctx context.Context, log *slog.Logger, kv jetstream.KeyValue, ready chan struct{},
	put func(key string, e jetstream.KeyValueEntry, seen time.Time), del func(key string)) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	go func() {
		defer w.Stop()
		initial := true
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					if initial {
						initial = false
						close(ready)
					}
					continue
				}
				seen := time.Now()
				if initial && e.Created().Before(seen) {
					seen = e.Created()
				}
				switch e.Operation() {
				case jetstream.KeyValuePut:
					put(e.Key(), e, seen)
				default:
					del(e.Key())
				}
			}
		}
	}()
	_ = log
	return nil
}

// hostState is one host as this coordinator last saw it.
type hostState struct {
	rec  protocol.HostRecord
	seen time.Time
}

// registry is the provider registry, derived from live records in
// brood_hosts (DESIGN.md §4): a provider exists while at least one live,
// non-draining host offers it; instances must have equal descriptors (the
// earliest-started instance defines it; a conflicting one is ignored).
type registry struct {
	mu     sync.Mutex
	hosts  map[string]*hostState
	expiry time.Duration
	ready  chan struct{}
	log    *slog.Logger
}

func newRegistry(expiry time.Duration, log *slog.Logger) *registry {
	return &registry{hosts: map[string]*hostState{}, expiry: expiry, ready: make(chan struct{}), log: log}
}

func (r *registry) put(key string, e jetstream.KeyValueEntry, seen time.Time) {
	rec, err := store.Decode[protocol.HostRecord](e)
	if err != nil {
		r.log.Warn("undecodable host record", "host", key, "err", err)
		return
	}
	r.mu.Lock()
	r.hosts[key] = &hostState{rec: rec, seen: seen}
	r.mu.Unlock()
}

func (r *registry) del(key string) {
	r.mu.Lock()
	delete(r.hosts, key)
	r.mu.Unlock()
}

func (r *registry) liveLocked(h *hostState, now time.Time) bool {
	return now.Sub(h.seen) <= r.expiry
}

// hostLive reports whether host id heartbeats within the expiry.
func (r *registry) hostLive(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.hosts[id]
	return ok && r.liveLocked(h, time.Now())
}

// hostKnown reports whether a record of host id exists, live or not.
func (r *registry) hostKnown(id string) (kind string, live, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.hosts[id]
	if !ok {
		return "", false, false
	}
	return h.rec.Kind, r.liveLocked(h, time.Now()), true
}

// providers returns the live providers sorted by name and their instance counts.
func (r *registry) providers() ([]protocol.ProviderDescriptor, map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	type inst struct {
		d       protocol.ProviderDescriptor
		started int64
		host    string
	}
	var all []inst
	for id, h := range r.hosts {
		if !r.liveLocked(h, now) || h.rec.Draining {
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
func (r *registry) provider(name string) (protocol.ProviderDescriptor, bool) {
	ds, _ := r.providers()
	for _, d := range ds {
		if d.Name == name {
			return d, true
		}
	}
	return protocol.ProviderDescriptor{}, false
}

// deadHosts returns the ids of hosts whose last heartbeat is older than the expiry.
func (r *registry) deadHosts() map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	out := map[string]bool{}
	for id, h := range r.hosts {
		if !r.liveLocked(h, now) {
			out[id] = true
		}
	}
	return out
}

// leaseState is one lease as this coordinator last saw it.
type leaseState struct {
	rec       protocol.AgentRecord
	rev       uint64
	firstSeen time.Time
}

// agentIndex caches brood_agents (leases): credentials for authority checks,
// and the sessions of each host and each parent for takeovers and disposal.
type agentIndex struct {
	mu     sync.Mutex
	byID   map[string]*leaseState
	drains map[string]protocol.DrainRecord
	ready  chan struct{}
	log    *slog.Logger
}

func newAgentIndex(log *slog.Logger) *agentIndex {
	return &agentIndex{byID: map[string]*leaseState{}, drains: map[string]protocol.DrainRecord{}, ready: make(chan struct{}), log: log}
}

// Keys of brood_agents other than leases (which are bare session ids).
const (
	keyOwns  = "owns."
	keyGrant = "grant."
	keyDrain = "drain."
)

func (a *agentIndex) put(key string, e jetstream.KeyValueEntry, seen time.Time) {
	switch {
	case strings.HasPrefix(key, keyDrain):
		if rec, err := store.Decode[protocol.DrainRecord](e); err == nil {
			a.mu.Lock()
			a.drains[strings.TrimPrefix(key, keyDrain)] = rec
			a.mu.Unlock()
		}
		return
	case strings.Contains(key, "."):
		return // ownership records and grants are read directly when needed
	}
	rec, err := store.Decode[protocol.AgentRecord](e)
	if err != nil {
		a.log.Warn("undecodable agent record", "session", key, "err", err)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	first := seen
	if old, ok := a.byID[key]; ok {
		first = old.firstSeen
	}
	a.byID[key] = &leaseState{rec: rec, rev: e.Revision(), firstSeen: first}
}

func (a *agentIndex) del(key string) {
	a.mu.Lock()
	if strings.HasPrefix(key, keyDrain) {
		delete(a.drains, strings.TrimPrefix(key, keyDrain))
	} else {
		delete(a.byID, key)
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

// get returns the cached lease of a session.
func (a *agentIndex) get(id string) (leaseState, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.byID[id]
	if !ok {
		return leaseState{}, false
	}
	return *l, true
}

// observe stores a fresher lease read directly from the bucket.
func (a *agentIndex) observe(rec protocol.AgentRecord, rev uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if old, ok := a.byID[rec.SessionID]; ok && old.rev >= rev {
		return
	}
	a.byID[rec.SessionID] = &leaseState{rec: rec, rev: rev, firstSeen: time.Now()}
}

// snapshot returns every cached lease.
func (a *agentIndex) snapshot() []leaseState {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]leaseState, 0, len(a.byID))
	for _, l := range a.byID {
		out = append(out, *l)
	}
	return out
}

// headerCache keeps immutable session headers (bounded; a miss reads BROOD_SESSIONS).
type headerCache struct {
	mu  sync.Mutex
	m   map[string]protocol.SessionHeader
	max int
}

func (c *headerCache) get(ctx context.Context, st *store.Store, id string) (protocol.SessionHeader, error) {
	c.mu.Lock()
	h, ok := c.m[id]
	c.mu.Unlock()
	if ok {
		return h, nil
	}
	h, err := st.GetHeader(ctx, id)
	if err != nil {
		return h, err
	}
	c.add(h)
	return h, nil
}

func (c *headerCache) add(h protocol.SessionHeader) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= c.max {
		for k := range c.m { // evict an arbitrary entry; headers are re-readable
			delete(c.m, k)
			break
		}
	}
	c.m[h.ID] = h
}
