package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/gopool"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Run records (brood_runs, docs/protocol.md §7.8): the one place a run or an
// epoch is created, claimed and settled. A record is created running by a
// coordinator, claimed by the host that starts it (a compare-and-set at the
// creation revision) and settled exactly once (a compare-and-set at the
// claim's revision, or at the creation revision by a coordinator that gave
// up on a start); whoever's compare-and-set lands is the settlement winner,
// and only the winner publishes the run's end (ends.go). See order.go for
// where each write falls in its operation.

// SettleBudget bounds the settlement of a run or epoch through transient
// JetStream failures (a leader election, a reconnect); a lost
// compare-and-set is final.
const SettleBudget = 60 * time.Second

// CreateRun writes rec, a new running record of a run or of an epoch: its
// spec (RunSpecKey, what only coordinators write) and its state (RunStateKey
// of rec's provider), both at once; an existing spec or state is
// ErrConflict. It returns the state's creation revision (the claim's and a
// failed start's compare-and-set name it). Both are written before the run
// id leaves the coordinator, but in no set order: a watch may deliver the
// state first (every reader goes through the spec, and a reader that finds
// the spec and not yet the state reads the state from the leader; the
// coordinators' run index files a spec as its running, unclaimed state until
// its state arrives). A failed write leaves the other behind: a spec with no
// state, read as no run, or a state with no spec, read by nobody.
func (s *Store) CreateRun(ctx context.Context, rec protocol.RunRecord) (uint64, error) {
	if rec.State != protocol.RunRunning {
		return 0, fmt.Errorf("store: create run %s: a run is created running, not %q", rec.RunID, rec.State)
	}
	if !protocol.ValidID(rec.RunID) || !protocol.ValidID(rec.Provider) {
		return 0, fmt.Errorf("store: create run %q of provider %q: a run names its id and provider", rec.RunID, rec.Provider)
	}
	specErr := make(chan error, 1)
	gopool.Go(ctx, func() { // a request handler's server's goroutines when ctx carries them
		_, err := Create(ctx, s.Runs, RunSpecKey(rec.Provider, rec.RunID), rec)
		specErr <- err
	})
	rev, err := Create(ctx, s.Runs, RunStateKey(rec.Provider, rec.RunID), rec)
	if serr := <-specErr; serr != nil {
		return 0, serr
	}
	if err != nil {
		return 0, err
	}
	s.cacheSpec(rec)
	return rev, nil
}

// Run reads a run record: its spec joined with its state (JoinRun), the
// state read under the provider its spec names, never under another. A
// missing one is ErrNotFound; the revision is the state's. A state missing
// where its spec exists is read again from the bucket's leader before it
// is ErrNotFound: the replica that answered may not have applied it yet (a
// node catching up after a restart), and the coordinator creates a run's
// state with its spec. The spec is found by the run id alone (RunSpec):
// a worker, which may read its own provider's runs only, reads with RunOf.
func (s *Store) Run(ctx context.Context, runID string) (Record[protocol.RunRecord], error) {
	return s.readRun(ctx, "", runID, Get[protocol.RunRecord])
}

// RunLatest is Run answered by the bucket's leader (GetLatest), for a
// decision that rests on the latest write.
func (s *Store) RunLatest(ctx context.Context, runID string) (Record[protocol.RunRecord], error) {
	return s.readRun(ctx, "", runID, GetLatest[protocol.RunRecord])
}

// RunOf is Run of a run of provider known to the caller (a worker's own):
// its spec is read under RunSpecKey of provider only, so a run of another
// provider is ErrNotFound.
func (s *Store) RunOf(ctx context.Context, provider, runID string) (Record[protocol.RunRecord], error) {
	return s.readRun(ctx, provider, runID, Get[protocol.RunRecord])
}

// RunLatestOf is RunLatest of a run of provider known to the caller (RunOf).
func (s *Store) RunLatestOf(ctx context.Context, provider, runID string) (Record[protocol.RunRecord], error) {
	return s.readRun(ctx, provider, runID, GetLatest[protocol.RunRecord])
}

func (s *Store) readRun(ctx context.Context, provider, runID string, get func(context.Context, jetstream.KeyValue, string) (Record[protocol.RunRecord], error)) (Record[protocol.RunRecord], error) {
	spec, err := s.runSpec(ctx, provider, runID)
	if err != nil {
		return Record[protocol.RunRecord]{}, err
	}
	st, err := get(ctx, s.Runs, RunStateKey(spec.Provider, runID))
	if errors.Is(err, ErrNotFound) {
		st, err = GetLatest[protocol.RunRecord](ctx, s.Runs, RunStateKey(spec.Provider, runID))
	}
	if err != nil {
		return Record[protocol.RunRecord]{}, err
	}
	return Record[protocol.RunRecord]{Value: JoinRun(spec, st.Value), Revision: st.Revision}, nil
}

// RunSpec reads run runID's spec: its record as a coordinator created it,
// under RunSpecKey of whichever provider it names (a direct get of
// RunSpecPattern's last message; run ids are unique). Specs never change,
// so they are cached (up to specsCachedMax); a missing one is read again
// from the bucket's leader before it is ErrNotFound (a replica may not
// have applied it yet). A spec whose key and record disagree (run id,
// provider) is no spec: ErrNotFound.
func (s *Store) RunSpec(ctx context.Context, runID string) (protocol.RunRecord, error) {
	return s.runSpec(ctx, "", runID)
}

// runSpec is RunSpec under RunSpecKey of provider when set (a worker's
// read of its own provider's run), under RunSpecPattern when "".
func (s *Store) runSpec(ctx context.Context, provider, runID string) (protocol.RunRecord, error) {
	if !protocol.ValidID(runID) || (provider != "" && !protocol.ValidID(provider)) {
		return protocol.RunRecord{}, fmt.Errorf("store: run %q of provider %q: %w", runID, provider, ErrNotFound) // names no key
	}
	if v, ok := s.specs.Load(runID); ok {
		if spec := v.(protocol.RunRecord); provider == "" || spec.Provider == provider {
			return spec, nil
		}
		return protocol.RunRecord{}, fmt.Errorf("store: run %s is not of provider %s: %w", runID, provider, ErrNotFound)
	}
	var r Record[protocol.RunRecord]
	var key string
	var err error
	if provider != "" {
		key = RunSpecKey(provider, runID)
		r, err = Get[protocol.RunRecord](ctx, s.Runs, key)
		if errors.Is(err, ErrNotFound) {
			r, err = GetLatest[protocol.RunRecord](ctx, s.Runs, key)
		}
	} else {
		key, r, err = getMatching[protocol.RunRecord](ctx, s, s.Runs, RunSpecPattern(runID), false)
		if errors.Is(err, ErrNotFound) {
			key, r, err = getMatching[protocol.RunRecord](ctx, s, s.Runs, RunSpecPattern(runID), true)
		}
	}
	if err != nil {
		return protocol.RunRecord{}, err
	}
	if r.Value.RunID != runID || !protocol.ValidID(r.Value.Provider) || key != RunSpecKey(r.Value.Provider, runID) {
		return protocol.RunRecord{}, fmt.Errorf("store: the spec of run %s under %s names run %q, provider %q: %w", runID, key, r.Value.RunID, r.Value.Provider, ErrNotFound)
	}
	s.cacheSpec(r.Value)
	return r.Value, nil
}

func (s *Store) cacheSpec(rec protocol.RunRecord) {
	if s.specsCached.Add(1) > specsCachedMax {
		s.specs.Clear()
		s.specsCached.Store(1)
	}
	s.specs.Store(rec.RunID, rec)
}

// specsCachedMax bounds the run specs RunSpec remembers; past it the cache
// starts over (specs are read again).
const specsCachedMax = 100_000

// JoinRun is the run record of spec (as its coordinator created it) and
// state (as its claimer and settler wrote it): what the coordinator decided
// (run and child ids, parent, provider, mode, notify subject, structured,
// remote, creation time, descriptor) from the spec, which only coordinators
// write; the claim and settlement (state, host, start, settlement, result)
// from the state, which its provider's workers may write. A worker that
// rewrites its own provider's state changes only how its own runs went.
func JoinRun(spec, state protocol.RunRecord) protocol.RunRecord {
	out := spec
	out.State, out.HostID, out.StartedAt, out.NotStarted = state.State, state.HostID, state.StartedAt, state.NotStarted
	out.SettledAt, out.SettledBy, out.Result, out.Takeovers = state.SettledAt, state.SettledBy, state.Result, state.Takeovers
	return out
}

// ClaimRun writes run, the running record a coordinator created at rev,
// back naming hostID as the host that starts it (HostID, StartedAt now), by
// compare-and-set at rev. It returns the claimed record and its revision;
// ErrConflict when another party changed the record first (another instance
// claimed it, or it was settled).
func (s *Store) ClaimRun(ctx context.Context, run protocol.RunRecord, rev uint64, hostID string) (protocol.RunRecord, uint64, error) {
	if run.State != protocol.RunRunning || rev == 0 {
		return run, 0, fmt.Errorf("store: claim run %s: only a running record at a known revision is claimed", run.RunID)
	}
	run.HostID, run.StartedAt = hostID, NowMs()
	nrev, err := Update(ctx, s.Runs, RunStateKey(run.Provider, run.RunID), run, rev)
	return run, nrev, err
}

// ReclaimRun writes claimed, the record a ClaimRun at rev returned with an
// error (its outcome unknown), again by compare-and-set at rev, so the
// claim's outcome becomes known: it returns the claimed record's revision
// whether this write or the earlier one landed (Update recognises its own
// value), and ErrConflict when another party changed the record first (a
// coordinator settled it, or another instance claimed it). Reading the record
// back is no such answer: a write still in flight (a replicated bucket's
// leader had not applied it yet) reads as absent and lands afterwards
// (make test's chaos seed, loaded: a one-shot run claimed by a live host
// that had read its claim back as missing and forgotten it, running for
// good with no lease and an empty log).
func (s *Store) ReclaimRun(ctx context.Context, claimed protocol.RunRecord, rev uint64) (uint64, error) {
	if claimed.State != protocol.RunRunning || claimed.HostID == "" || rev == 0 {
		return 0, fmt.Errorf("store: reclaim run %s: only a claimed running record at the revision it was claimed at is written again", claimed.RunID)
	}
	return Update(ctx, s.Runs, RunStateKey(claimed.Provider, claimed.RunID), claimed, rev)
}

// HoldRun writes run, the record this host claimed (at rev, the claim's
// revision or a later one of its own), back unchanged by compare-and-set at
// rev, once the host holds the session's lease. A coordinator settles a
// claimed record left without a lease (orphans.go in the coordinator) by a
// compare-and-set at the revision it read before it found no lease, so of
// the two exactly one lands: a host paused between its claim and its lease
// never starts an epoch settled meanwhile, and a settlement never ends an
// epoch whose host holds the lease. Epochs only: a one-shot run's host
// takes its lease beside its claim, and a coordinator settling such a
// claim orphaned creates the lease itself first (the lease is the fence).
// It returns the new revision;
// ErrConflict when the record changed first (the run is no longer this
// host's to start).
func (s *Store) HoldRun(ctx context.Context, run protocol.RunRecord, rev uint64) (uint64, error) {
	if run.State != protocol.RunRunning || rev == 0 {
		return 0, fmt.Errorf("store: hold run %s: only a running record at a known revision is held", run.RunID)
	}
	return Update(ctx, s.Runs, RunStateKey(run.Provider, run.RunID), run, rev)
}

// Settled returns rec settled by `by` (a host or coordinator id) with res,
// now. Build it once per settlement and pass the same record to every
// attempt of SettleRun: a retry that finds its own earlier write recognises
// it by its value.
func Settled(rec protocol.RunRecord, by string, res protocol.SubagentResult) protocol.RunRecord {
	rec.State, rec.SettledAt, rec.SettledBy, rec.Result = protocol.RunSettled, NowMs(), by, &res
	return rec
}

// NotStarted returns rec settled by `by` as never started: stop reason
// error with cause's code and a diagnostic saying the child was never
// started, and NotStarted set (no subagent/start was published, so no
// subagent/end is). Hosts settle a start that failed after their claim this
// way, coordinators a start no instance took.
func NotStarted(rec protocol.RunRecord, by string, cause error) protocol.RunRecord {
	pe := protocol.AsError(cause)
	rec = Settled(rec, by, protocol.SubagentResult{
		Output: []protocol.ContentBlock{}, StopReason: protocol.StopError, ErrorCode: pe.Code,
		Diagnostic: protocol.TruncateDiagnostic("the child was never started: " + pe.Error()),
	})
	rec.NotStarted = true
	return rec
}

// SettleRun writes settled (from Settled or NotStarted) by compare-and-set at
// rev, the revision its writer last knew (its claim, or the creation). It
// reports whether this write settled the run: false with a nil error when
// another party changed the record first (it settled it, or, for a
// coordinator failing a start, an instance claimed it). Transient failures
// are retried within ctx's deadline (retry.go); a run is settled only once.
//
// The settled state is written with a per-message TTL of RunsTTL: it is the
// one write that gives a run's state a lifetime (brood_runs has no max age,
// so a running run's records never expire), and the server removes the
// state RunsTTL after it. No write follows a settlement on the state (every
// other write is a compare-and-set at a running revision), so the TTL
// stays. Its spec is given the same lifetime by a coordinator that saw the
// settlement (ExpireRunSpec).
func (s *Store) SettleRun(ctx context.Context, settled protocol.RunRecord, rev uint64) (bool, error) {
	if settled.State != protocol.RunSettled || settled.Result == nil {
		return false, fmt.Errorf("store: settle run %s: the record is not settled with a result", settled.RunID)
	}
	_, err := UpdateTTL(ctx, s.Runs, RunStateKey(settled.Provider, settled.RunID), settled, rev, s.RunsTTL())
	if errors.Is(err, ErrConflict) {
		return false, nil
	}
	return err == nil, err
}

// RunsTTL is the lifetime of a settled run's records: Config.RunsMaxAge,
// rounded up to whole seconds and at least 1 s (the least per-message TTL
// the server takes).
func (s *Store) RunsTTL() time.Duration {
	return max(time.Second, (s.Cfg.RunsMaxAge + time.Second - 1).Truncate(time.Second))
}

// ExpireRunSpec gives the spec of a settled run its lifetime: it writes
// spec (the record read at rev, as its coordinator created it) back with
// its State RunSettled and a per-message TTL of RunsTTL, by compare-and-set
// at rev, so the server removes it RunsTTL after this write (about when its
// state goes: SettleRun). Coordinators call it once they saw the run's
// state settled, off every reply path (services/coordinator, orphans.go),
// and for a spec whose state was never created. The State marks the spec
// as given its lifetime (a spec is otherwise written once, running):
// readers take a run's state from its state key (JoinRun), never from its
// spec. It reports whether the spec has its lifetime: true when this write
// landed, or an identical one did (another coordinator's, which expired it
// from the same revision: Update recognises the value); false with a nil
// error when the spec changed otherwise since rev, or is gone.
func (s *Store) ExpireRunSpec(ctx context.Context, spec protocol.RunRecord, rev uint64) (bool, error) {
	if !protocol.ValidID(spec.RunID) || rev == 0 {
		return false, fmt.Errorf("store: expire the spec of run %q: a spec names its run and is read at a revision", spec.RunID)
	}
	spec.State = protocol.RunSettled
	_, err := UpdateTTL(ctx, s.Runs, RunSpecKey(spec.Provider, spec.RunID), spec, rev, s.RunsTTL())
	if errors.Is(err, ErrConflict) {
		return false, nil
	}
	return err == nil, err
}

// ExpireRunsKey gives key of brood_runs, still at revision rev, a lifetime
// of RunsTTL when its value has none (no Nats-TTL): it writes the same
// value back with the TTL by compare-and-set at rev. Coordinators call it
// for the keys no run's lifetime covers (services/coordinator, orphans.go):
// a state whose spec was never created (or names another provider), a key
// of no known layout, and a settled state written without a TTL (before
// brood_runs lost its max age). It reports whether the key now has a TTL
// from this call; false with a nil error when the key is gone, changed
// since rev, or already has a TTL.
func (s *Store) ExpireRunsKey(ctx context.Context, key string, rev uint64) (bool, error) {
	if _, ok := layerAs[ttlUpdater](s.Runs); !ok || rev == 0 {
		return false, fmt.Errorf("store: expire brood_runs key %q at revision %d: not a store's bucket, or no revision", key, rev)
	}
	var m *jetstream.RawStreamMsg
	err := Retry(ctx, func(ctx context.Context) (err error) {
		m, err = s.leaderLast(ctx, kvStreamPrefix+s.Runs.Bucket(), "$KV."+s.Runs.Bucket()+"."+key)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			m, err = nil, nil
		}
		return err
	})
	switch {
	case err != nil:
		return false, err
	case m == nil || m.Sequence != rev || m.Header.Get(kvOperation) != "" || m.Header.Get(jetstream.MsgTTLHeader) != "":
		return false, nil
	}
	_, err = updateRaw(ctx, s.Runs, key, m.Data, rev, s.RunsTTL())
	if errors.Is(err, ErrConflict) {
		return false, nil
	}
	return err == nil, err
}
