// Package hostreg is the coordinator's host registry (docs/design.md §4;
// docs/architecture.md §6): the provider registry derived from brood_hosts
// and the judgement of which hosts are live, on an observed clock of the
// coordinator's own heartbeats. The coordinator feeds it from its hosts
// watch (Put, Del) and its own heartbeats (Wrote), and reads it.
package hostreg

import (
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// hostState is one host as this coordinator last saw it.
type hostState struct {
	rec protocol.HostRecord
	// obs is the observed clock (Registry.obs) when its latest heartbeat
	// reached this coordinator.
	obs time.Duration
	// rev is the bucket revision of rec: a record delivered again (a
	// watch opened again) or read from the leader already is not news.
	rev uint64
}

// Registry is the provider registry, derived from the records in brood_hosts
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
// Observed clock (obs) advances by the time between two consecutive own
// heartbeats that came back, and stands still while they do not: while this
// coordinator is cut off, paused, or its watch is restarting or cannot read
// the bucket. A gap longer than gapMax between two own heartbeats is not
// counted either (the server itself may have been down: nobody could write),
// and a host's silence counts only from the latest such gap, so a host gets
// the whole expiry of observed time after it. A host is dead when more than
// the expiry of observed time passed since its latest heartbeat (or the
// latest gap) came back; a new heartbeat from it makes it live again.
type Registry struct {
	mu sync.Mutex
	// hosts holds the hosts whose record brood_hosts holds, by host id:
	// removed when a host's record is deleted (a host that stops) or lapses
	// (MaxAge after its latest heartbeat, kvwatch.Watch). Bound: the live hosts
	// and those silent for less than MaxAge (store.Config.HostsMaxAge,
	// 10 min by default).
	hosts map[string]*hostState
	// MaxAge is brood_hosts' max age (store.Config.HostsMaxAge; 0: none),
	// set before the registry is fed.
	MaxAge   time.Duration
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

// New returns the registry of the coordinator self, which heartbeats
// every interval; hosts expire after expiry of observed time.
func New(self string, interval, expiry time.Duration, log *slog.Logger) *Registry {
	return &Registry{
		hosts: map[string]*hostState{}, self: self, expiry: expiry, log: log,
		gapMax:   max(expiry/2, interval*3/2),
		staleMax: max(3*interval, 2*time.Second),
	}
}

// Put applies host key's record e; it lapses after the bucket's max age
// (kvwatch.Watch).
func (r *Registry) Put(key string, e jetstream.KeyValueEntry) time.Duration {
	rec, err := store.Decode[protocol.HostRecord](e)
	if err != nil {
		r.log.Warn("undecodable host record", "host", key, "err", err)
		return r.MaxAge
	}
	if rec.HostID != key {
		r.log.Warn("host record under another host's key ignored", "key", key, "hostId", rec.HostID)
		return r.MaxAge
	}
	rec.Providers = inScope(key, rec.Providers, r.log)
	r.mu.Lock()
	defer r.mu.Unlock()
	if key == r.self {
		r.ownBeat(rec.Heartbeat, e.Revision())
	}
	if h, ok := r.hosts[key]; ok && h.rev >= e.Revision() {
		return r.MaxAge // applied already (confirm read it from the leader first)
	}
	r.hosts[key] = &hostState{rec: rec, obs: r.obs, rev: e.Revision()}
	return r.MaxAge
}

// Confirm applies rec, host key's record at revision rev as the bucket's
// leader answered it, when the registry holds an older revision of it or
// none: a heartbeat its watch did not deliver (a watch silent or opened
// again through an election, a snapshot without the key). It reports
// whether the host is live afterwards: a record newer than the registry's
// makes it live from now on the observed clock; the same one leaves the
// judgement as it was. A record filed under another host's key is not
// applied (and proves nothing of key).
func (r *Registry) Confirm(key string, rec protocol.HostRecord, rev uint64) bool {
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
func (r *Registry) ownBeat(issueMs int64, rev uint64) {
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

// Wrote records an own heartbeat that JetStream acknowledged at rev.
func (r *Registry) Wrote(rev uint64) {
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

// Stalled reports whether an own heartbeat JetStream acknowledged more than
// staleMax ago has not come back through the watch: the watch is silent and
// must be opened again. It resets the wait, so a restart is asked for once.
func (r *Registry) Stalled() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unconfirmed.IsZero() || time.Since(r.unconfirmed) <= r.staleMax {
		return false
	}
	r.unconfirmed = time.Time{}
	return true
}

func (r *Registry) Del(key string) {
	r.mu.Lock()
	delete(r.hosts, key)
	r.mu.Unlock()
}

// Observed returns the observed clock.
func (r *Registry) Observed() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.obs
}

// Expired reports whether more than the expiry of observed time passed
// since since, in one stretch without a gap.
func (r *Registry) Expired(since time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.expiredLocked(since)
}

func (r *Registry) expiredLocked(since time.Duration) bool {
	return r.obs-max(since, r.gapObs) > r.expiry
}

func (r *Registry) liveLocked(h *hostState) bool {
	return !r.expiredLocked(h.obs)
}

// LiveHosts reports the live hosts by kind (brood_hosts_live).
func (r *Registry) LiveHosts(add func(v float64, labels ...string)) {
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

// LiveInstances reports the live instances of each provider
// (brood_provider_instances).
func (r *Registry) LiveInstances(add func(v float64, labels ...string)) {
	_, counts := r.Providers()
	for name, n := range counts {
		add(float64(n), name)
	}
}

// HostLive reports whether host id is known and not judged dead.
func (r *Registry) HostLive(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.hosts[id]
	return ok && r.liveLocked(h)
}

// HostKnown reports whether a record of host id exists, live or not.
func (r *Registry) HostKnown(id string) (kind string, live, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.hosts[id]
	if !ok {
		return "", false, false
	}
	return h.rec.Kind, r.liveLocked(h), true
}

// Providers returns the live providers sorted by name and their instance counts.
func (r *Registry) Providers() ([]protocol.ProviderDescriptor, map[string]int) {
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

// Provider returns the live descriptor of name.
//
// It is the descriptor providers would list for name (the one of the live,
// not draining host that started first, ties by host id), found without
// building the whole list: every start asks it (issue 12's profile: 7 µs of
// a run's coordinator CPU sorted and mapped every provider for one).
func (r *Registry) Provider(name string) (protocol.ProviderDescriptor, bool) {
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

// LiveCoordinators returns the ids of the live coordinators, sorted.
func (r *Registry) LiveCoordinators() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for id, h := range r.hosts {
		if h.rec.Kind == protocol.HostCoordinator && r.liveLocked(h) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// Offering returns the ids of the hosts, live or not, not draining, that
// offer provider name with desc, its canonical descriptor (Provider).
func (r *Registry) Offering(name string, desc protocol.ProviderDescriptor) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for id, h := range r.hosts {
		if h.rec.Draining {
			continue
		}
		for _, d := range h.rec.Providers {
			if d.Name == name && d.Equal(desc) {
				ids = append(ids, id)
				break
			}
		}
	}
	return ids
}

// Registered counts the host records, live or not, that offer provider
// name.
func (r *Registry) Registered(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, h := range r.hosts {
		for _, d := range h.rec.Providers {
			if d.Name == name {
				n++
				break
			}
		}
	}
	return n
}
