package coordinator

import (
	"context"
	"sync"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// The session headers and continuable children's descriptors a replica
// caches (bounded maps, read through on a miss; caches.go has the leases).

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
