package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator/slotrecord"
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
// and live root leases of the user this replica sees). The record is taken
// as every slot record is (slotrecord.Records.Reserve: this replica's opens of
// one user wait for each other within ctx, reads from the leader, the
// compare-and-set's retries, an UNAVAILABLE that says how long it took).
// Anonymous opens (user "") are not limited.
func (c *Coordinator) reserveRoot(ctx context.Context, user, id string) error {
	if user == "" {
		return nil
	}
	return c.rootSlots.Reserve(ctx, user, func(ctx context.Context, rec protocol.UserRootsRecord, now int64) (protocol.UserRootsRecord, error) {
		kept, count, err := c.countRoots(ctx, user, rec.Roots, now, false)
		if err != nil {
			return rec, err
		}
		if count >= c.cfg.UserOpenRootsMax {
			if kept, count, err = c.countRoots(ctx, user, rec.Roots, now, true); err != nil {
				return rec, err
			}
			if count >= c.cfg.UserOpenRootsMax {
				return rec, protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
					"limit": "open roots per user",
					"reason": fmt.Sprintf("user %s holds %d open roots; the limit is %d: close roots you no longer use (agents.close)",
						user, count, c.cfg.UserOpenRootsMax)})
			}
		}
		return protocol.UserRootsRecord{Roots: append(kept, protocol.RootSlot{SessionID: id, ReservedAt: now})}, nil
	})
}

// newRootSlots is the users' open-root slot records, brood_agents
// `userroots.<user>` (store.UserRoots, store.WriteUserRoots).
func (c *Coordinator) newRootSlots() *slotrecord.Records[protocol.UserRootsRecord] {
	return &slotrecord.Records[protocol.UserRootsRecord]{
		Read: c.st.UserRoots, Write: c.st.WriteUserRoots,
		Slot: "open root", Records: "open roots", Admissions: "opens",
		Of:      func(user string) string { return "user " + user },
		Backoff: func() time.Duration { return c.slotBackoff() }, Background: c.background,
		Grace: func() time.Duration { return time.Duration(c.slotGrace()) * time.Millisecond }, Log: c.log,
	}
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

// releaseRootSlot gives back the slot of an open that failed
// (slotrecord.Records.Release: within what is left of ctx, then in the background
// within store.SettleBudget; a slot left behind lapses after slotGrace).
func (c *Coordinator) releaseRootSlot(ctx context.Context, user, id string) {
	if user == "" {
		return
	}
	c.rootSlots.Release(ctx, user, func(rec protocol.UserRootsRecord) (protocol.UserRootsRecord, bool) {
		kept := slices.DeleteFunc(slices.Clone(rec.Roots), func(s protocol.RootSlot) bool { return s.SessionID == id })
		return protocol.UserRootsRecord{Roots: kept}, len(kept) != len(rec.Roots)
	})
}
