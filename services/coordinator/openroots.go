package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// A user's open roots (Config.UserOpenRootsMax; docs/security.md, "Limits").
// Counting the live root leases that name the user is not enough: two opens
// of one user served by two replicas at the same instant both see the same
// count before either root's lease exists, so R replicas could admit R-1
// roots past the quota (and more, while their lease watches lag). So, as
// for the live-children limit (slots.go), every open on a user's subject
// first takes a slot in the user's record, brood_agents `userroots.<user>`,
// by compare-and-set: the opens of one user are serialized by the record's
// revision, whichever replica serves them. A slot counts while its root's
// lease is live, or for slotGrace after it was taken (the open writes the
// root's header and lease after its slot); the next open of the user drops
// the others: a root closed or lapsed (this replica saw its lease go, or
// the bucket's leader has no live lease of it), or an open that failed. A
// refusal first reads every root it counted from the leader, so a root
// closed through another replica whose lease watch lags here is not counted.

// reserveRoot takes a slot of user's open-roots quota for the new root id,
// or refuses with LIMIT_EXCEEDED when user already holds UserOpenRootsMax
// roots (slots of roots whose lease is live or that are within their grace,
// and live root leases of the user this replica sees). This replica's opens
// of one user wait for each other, so they do not race on the record.
// Anonymous opens (user "") are not limited.
func (c *Coordinator) reserveRoot(ctx context.Context, user, id string) error {
	if user == "" {
		return nil
	}
	m := c.quotas.openLock(user)
	m.Lock()
	defer m.Unlock()
	read := store.Get[protocol.UserRootsRecord]
	for attempt := 0; attempt < slotAttemptsMax; attempt++ {
		cur, err := read(ctx, c.st.Agents, store.UserRootsKey(user))
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return protocol.Errorf(protocol.CodeUnavailable, "read the open roots of user %s: %w", user, err)
		}
		now := store.NowMs()
		kept, count, err := c.countRoots(ctx, user, cur.Value.Roots, now, false)
		if err != nil {
			return err
		}
		if count >= c.cfg.UserOpenRootsMax {
			if kept, count, err = c.countRoots(ctx, user, cur.Value.Roots, now, true); err != nil {
				return err
			}
			if count >= c.cfg.UserOpenRootsMax {
				return protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
					"limit": "open roots per user",
					"reason": fmt.Sprintf("user %s holds %d open roots; the limit is %d: close roots you no longer use (agents.close)",
						user, count, c.cfg.UserOpenRootsMax)})
			}
		}
		next := protocol.UserRootsRecord{Roots: append(kept, protocol.RootSlot{SessionID: id, ReservedAt: now})}
		_, err = c.st.WriteUserRoots(ctx, user, next, cur.Revision)
		if err == nil {
			return nil
		}
		if !errors.Is(err, store.ErrConflict) {
			return protocol.Errorf(protocol.CodeUnavailable, "reserve an open root of user %s: %w", user, err)
		}
		// Another replica's open of this user won: read the record from the
		// leader (a follower may not have that write yet) after a short
		// random wait, so the replicas' opens interleave.
		read = store.GetLatest[protocol.UserRootsRecord]
		select {
		case <-ctx.Done():
			return protocol.Errorf(protocol.CodeUnavailable, "reserve an open root of user %s: %w", user, ctx.Err())
		case <-time.After(c.slotBackoff()):
		}
	}
	return protocol.Errorf(protocol.CodeUnavailable, "the open roots of user %s kept changing; retry", user)
}

// countRoots returns the slots to keep of user's record and how many open
// roots they and this replica's live root leases of user count. A slot is
// kept while its root's lease is live, or within slotGrace of its
// reservation unless this replica saw its root's lease go; past its grace,
// a root this replica's cache neither shows live nor saw end is read from
// the bucket's leader. fresh reads every counted root from the leader
// instead (before a refusal): a root whose lease is gone or lapsed there is
// not counted. A read that fails counts the root (a refusal is retried, a
// quota passed is not undone).
func (c *Coordinator) countRoots(ctx context.Context, user string, slots []protocol.RootSlot, now int64, fresh bool) (kept []protocol.RootSlot, count int, err error) {
	live := map[string]bool{}
	for _, l := range c.agents.snapshot() {
		if l.rec.Kind == protocol.AgentRoot && l.rec.User == user && c.leaseLive(l.rec) {
			live[l.rec.SessionID] = true
		}
	}
	leaderLive := func(id string) bool {
		l, err := c.st.LeaseLatest(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return false
		}
		return err != nil || (l.Value.Kind == protocol.AgentRoot && l.Value.ExpiresAt > now)
	}
	for _, s := range slots {
		inGrace := now-s.ReservedAt < c.slotGrace() && !c.agents.hasEnded(s.SessionID)
		switch {
		case fresh && !inGrace:
			if !leaderLive(s.SessionID) {
				continue
			}
		case live[s.SessionID] || inGrace:
		case c.agents.hasEnded(s.SessionID) || !leaderLive(s.SessionID):
			continue
		}
		kept = append(kept, s)
	}
	count = len(kept)
	for id := range live {
		if slices.ContainsFunc(kept, func(s protocol.RootSlot) bool { return s.SessionID == id }) {
			continue
		}
		if !fresh || leaderLive(id) {
			count++
		}
	}
	return kept, count, ctx.Err()
}

// releaseRootSlot gives back the slot of an open that failed (best effort:
// a slot left behind lapses after slotGrace).
func (c *Coordinator) releaseRootSlot(ctx context.Context, user, id string) {
	if user == "" {
		return
	}
	m := c.quotas.openLock(user)
	m.Lock()
	defer m.Unlock()
	for attempt := 0; attempt < slotAttemptsMax; attempt++ {
		cur, err := store.GetLatest[protocol.UserRootsRecord](ctx, c.st.Agents, store.UserRootsKey(user))
		if err != nil {
			return
		}
		kept := slices.DeleteFunc(slices.Clone(cur.Value.Roots), func(s protocol.RootSlot) bool { return s.SessionID == id })
		if len(kept) == len(cur.Value.Roots) {
			return
		}
		if _, err := c.st.WriteUserRoots(ctx, user, protocol.UserRootsRecord{Roots: kept}, cur.Revision); !errors.Is(err, store.ErrConflict) {
			return
		}
	}
}
