// Package collector garbage-collects the records of closed roots' trees
// (issue 17; docs/security.md, "Garbage collection"): every agents.open is
// a header and a log kept in JetStream, so roots that were closed (or whose
// lease lapsed) long ago are removed, with everything below them, once
// their tree has been idle for the retention and nothing in it is live or
// pending.
//
// What NATS removes on its own is left to it: grants carry a per-key TTL,
// a settled run's records too (RunsMaxAge from its settlement; the
// coordinators give every key of brood_runs its lifetime), host records
// live their bucket's max age, lifecycle events their stream's. Headers and logs cannot: a message's TTL is fixed
// when it is written, and a session lives as long as its tree is used. So
// the collector sweeps. It runs as its own NATS user (deploy: `collector`),
// the only one besides the admin that may purge BROOD_SESSIONS and
// BROOD_LOG, so a compromised coordinator still cannot wipe the logs.
//
// One sweep (every Interval):
//  1. lists the closed-root markers (brood_agents closed.<root>, written by
//     coordinators before a root's lease goes) whose ClosedAt is at least
//     Retention ago, and takes at most RootsPerSweepMax of them at random;
//  2. for each, walks the tree by the child indexes and reads, from the
//     leaders, each session's lease, inbox, header and last log record: a
//     tree with a lease (a live agent, or one still to be taken over), an
//     inbox item (an accepted message), or a write within Retention, is
//     kept (a root live again loses its marker; its next close writes a
//     new one);
//  3. removes every header of the tree, children first, and reads every
//     session again: if a lease, an inbox item or a log record appeared in
//     between (a followup accepted in that instant), it puts the headers
//     back and keeps the tree;
//  4. purges each session's log and child index, deletes its slot record,
//     then the root's marker.
//
// A followup admitted through a coordinator that still has a header of the
// tree cached, after step 3's second read, is accepted but cannot run (its
// session's header is gone): a window of the length of step 4, once a tree
// has been idle for the whole retention (docs/security.md, "Not yet
// enforced").
package collector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand"
	"slices"
	"time"

	"github.com/brood-dev/brood/internal/store"
)

// Defaults of Config.
const (
	// DefaultRetention is how long a closed root's tree is kept after its
	// last write (7 days).
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultInterval is the time between sweeps (10 minutes).
	DefaultInterval = 10 * time.Minute
	// DefaultRootsPerSweepMax bounds the trees one sweep examines (1,000).
	DefaultRootsPerSweepMax = 1000
	// DefaultTreeSessionsMax bounds the sessions of one tree the collector
	// walks (100,000); a larger tree is kept and logged.
	DefaultTreeSessionsMax = 100_000
	// DefaultClosedRootsListMax bounds the markers one sweep lists
	// (1,000,000).
	DefaultClosedRootsListMax = 1_000_000
	// SweepTimeout bounds one sweep.
	SweepTimeout = 5 * time.Minute
)

// Config configures a Collector. Zero values take the defaults above.
type Config struct {
	Store *store.Store
	// Retention: a closed root's tree is removed once its last write (the
	// close, a header, a log record) is at least this old.
	Retention time.Duration
	// Interval between sweeps; the first sweep runs at start.
	Interval           time.Duration
	RootsPerSweepMax   int
	TreeSessionsMax    int
	ClosedRootsListMax int
	Logger             *slog.Logger
	// Now is the clock (time.Now unless a test sets it).
	Now func() time.Time
}

// Collector removes the records of closed roots' trees; Run it.
type Collector struct {
	cfg Config
	log *slog.Logger
	// headersRemoved, when set (tests), runs after a tree's headers are
	// removed and before it is read again.
	headersRemoved func(root string)
}

// New checks cfg and returns a collector.
func New(cfg Config) (*Collector, error) {
	if cfg.Store == nil {
		return nil, errors.New("collector: Config.Store is required")
	}
	if cfg.Retention < 0 || cfg.Interval < 0 {
		return nil, errors.New("collector: Retention and Interval must not be negative")
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	def(&cfg.RootsPerSweepMax, DefaultRootsPerSweepMax)
	def(&cfg.TreeSessionsMax, DefaultTreeSessionsMax)
	def(&cfg.ClosedRootsListMax, DefaultClosedRootsListMax)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Collector{cfg: cfg, log: cfg.Logger}, nil
}

// Run sweeps at once and then every Interval until ctx is done (nil). A
// sweep that fails is logged and tried again at the next one.
func (c *Collector) Run(ctx context.Context) error {
	c.log.Info("collector serving", "retention", c.cfg.Retention, "interval", c.cfg.Interval)
	defer c.log.Info("collector stopped")
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, SweepTimeout)
		st, err := c.Sweep(sctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			c.log.Warn("collector sweep failed", "err", err)
		case st.Collected > 0:
			c.log.Info("collected closed roots", "roots", st.Collected, "sessions", st.Sessions, "kept", st.Kept)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Stats is what one sweep did: trees examined, collected (and their
// sessions) and kept.
type Stats struct {
	Examined, Collected, Sessions, Kept int
}

// Sweep runs one sweep (see the package comment).
func (c *Collector) Sweep(ctx context.Context) (Stats, error) {
	var st Stats
	markers, err := c.cfg.Store.ClosedRoots(ctx, c.cfg.ClosedRootsListMax)
	if err != nil {
		return st, err
	}
	now := c.cfg.Now()
	due := slices.DeleteFunc(markers, func(m store.ClosedRoot) bool {
		return now.Sub(time.UnixMilli(m.ClosedAt)) < c.cfg.Retention
	})
	rand.Shuffle(len(due), func(i, j int) { due[i], due[j] = due[j], due[i] })
	for _, m := range due[:min(len(due), c.cfg.RootsPerSweepMax)] {
		st.Examined++
		n, why, err := c.collect(ctx, m)
		switch {
		case err != nil:
			st.Kept++
			c.log.Warn("could not collect a closed root", "root", m.SessionID, "err", err)
		case n == 0:
			st.Kept++
			c.log.Debug("closed root kept", "root", m.SessionID, "why", why)
		default:
			st.Collected++
			st.Sessions += n
		}
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
	}
	return st, nil
}

// collect removes the records of m's tree when it may, returning how many
// sessions it removed (0: kept, and why).
func (c *Collector) collect(ctx context.Context, m store.ClosedRoot) (int, string, error) {
	s := c.cfg.Store
	tree, err := s.Tree(ctx, m.SessionID, c.cfg.TreeSessionsMax)
	if err != nil {
		return 0, "", err
	}
	acts, why, err := c.idle(ctx, tree, time.UnixMilli(m.ClosedAt))
	if err != nil || why != "" {
		if why == "the root is live" {
			// Reopened: its next close writes a new marker.
			err = errors.Join(err, s.DeleteClosedRoot(ctx, m.SessionID, m.Revision))
		}
		return 0, why, err
	}
	for i := len(tree) - 1; i >= 0; i-- {
		if err := s.PurgeHeader(ctx, tree[i].ID); err != nil {
			return 0, "", errors.Join(err, c.restore(ctx, acts))
		}
	}
	if c.headersRemoved != nil {
		c.headersRemoved(m.SessionID)
	}
	// A message accepted, or an agent started, between the first reads and
	// the headers' removal keeps the tree.
	if _, why, err := c.idle(ctx, tree, time.UnixMilli(m.ClosedAt)); err != nil || why != "" {
		if why == "" {
			why = "a second read failed"
		}
		return 0, why, errors.Join(err, c.restore(ctx, acts))
	}
	for i := len(tree) - 1; i >= 0; i-- {
		if err := s.PurgeSession(ctx, tree[i]); err != nil {
			return 0, "", err // headers gone: the next sweep purges the rest
		}
	}
	return len(tree), "", s.DeleteClosedRoot(ctx, m.SessionID, m.Revision)
}

// idle reads every session of tree and returns why the tree must be kept
// ("" when it may go) and what it read.
func (c *Collector) idle(ctx context.Context, tree []store.TreeSession, closedAt time.Time) ([]store.SessionActivity, string, error) {
	last := closedAt
	acts := make([]store.SessionActivity, len(tree))
	for i, n := range tree {
		a, err := c.cfg.Store.Activity(ctx, n)
		if err != nil {
			return nil, "", err
		}
		switch {
		case a.Leased && i == 0:
			return nil, "the root is live", nil
		case a.Leased:
			return nil, fmt.Sprintf("session %s has a live agent", n.ID), nil
		case a.Pending:
			return nil, fmt.Sprintf("session %s has a pending inbox item", n.ID), nil
		}
		if a.LastWrite.After(last) {
			last = a.LastWrite
		}
		acts[i] = a
	}
	if age := c.cfg.Now().Sub(last); age < c.cfg.Retention {
		return nil, fmt.Sprintf("written %s ago, within the retention of %s", age.Round(time.Second), c.cfg.Retention), nil
	}
	return acts, "", nil
}

// restoreTimeout bounds putting back the headers of a stopped collection,
// which goes on when the sweep's context ends (a collector stopping).
const restoreTimeout = 30 * time.Second

// restore puts back the headers a stopped collection removed.
func (c *Collector) restore(ctx context.Context, acts []store.SessionActivity) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), restoreTimeout)
	defer cancel()
	var errs []error
	for _, a := range acts {
		if a.Header == nil {
			continue
		}
		if err := c.cfg.Store.PutHeader(ctx, *a.Header); err != nil && !errors.Is(err, store.ErrConflict) {
			errs = append(errs, fmt.Errorf("put back the header of %s: %w", a.Header.ID, err))
		}
	}
	return errors.Join(errs...)
}
