package worker

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Unit tests of a host's one-shot start (runs.go, claim.go) without a
// coordinator: the test plays the coordinator's part (it creates the run
// record and sends the start request straight to Host.startRun) and reads
// what the host wrote and published.

// testHost is a host of one in-process provider, "spawn", on a fresh
// server, whose model is models (the scripted model when nil). It is not
// Run: the tests call its request handlers directly.
func testHost(t *testing.T, models ModelFactory) (*Host, *store.Store, *nats.Conn) {
	t.Helper()
	s := testutil.Server(t)
	nc := testutil.Connect(t, s.ClientURL())
	st := testutil.Store(t, nc)
	if models == nil {
		models = func() (model.Model, error) { return model.NewScripted(), nil }
	}
	p := &InProcess{Desc: InProcessDescriptor("spawn", false), Models: models, Logger: testutil.Logger(t),
		Tools: func(SessionSpec) ([]*agent.Tool, error) { return nil, nil }}
	h, err := New(Config{NC: nc, Store: st, Providers: []Provider{p}, HostID: "H1", Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	testutil.ServeLeaderReads(t, st) // no coordinator here
	return h, st, nc
}

// startRequest creates a running record for a new child of parent P1, as a
// coordinator does, and returns the start request naming it, due in a
// minute, whose notice goes to notify.
func startRequest(t *testing.T, st *store.Store, childID, prompt, notify string) protocol.ProviderStartRequest {
	t.Helper()
	rec := protocol.RunRecord{
		RunID: childID, ChildID: childID, ParentSession: "P1", Provider: "spawn", Mode: protocol.ModeOneShot,
		Notify: notify, State: protocol.RunRunning, CreatedAt: store.NowMs(),
	}
	rev, err := st.CreateRun(context.Background(), rec)
	if err != nil {
		t.Fatal(err)
	}
	return protocol.ProviderStartRequest{
		RunID: childID, Run: rec, RunRevision: protocol.Seq(rev), Provider: "spawn", Notify: notify,
		Header:   protocol.SessionHeader{Version: protocol.SessionHeaderVersion, ID: childID, ParentSession: "P1", CreatedAt: rec.CreatedAt, Cwd: "/w", Provider: "spawn"},
		Prompt:   protocol.Text(prompt),
		Deadline: time.Now().Add(time.Minute).UnixMilli(),
	}
}

// receiveNoticeRequest waits for the host's request for a run's notice
// (store.RequestRunNotice), which a coordinator answers by publishing the
// notice the run's records hold.
func receiveNoticeRequest(t *testing.T, ch chan *nats.Msg) *nats.Msg {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(20 * time.Second):
		t.Fatal("no notice request within 20 s")
	}
	return nil
}

// waitRunDone waits until the host let go of every run (execute returned).
func waitRunDone(t *testing.T, h *Host) {
	t.Helper()
	testutil.Eventually(t, 20*time.Second, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.runs) == 0
	}, "the host still holds a run")
}

func TestNewRefusesAnIncompleteConfig(t *testing.T) {
	s := testutil.Server(t)
	nc := testutil.Connect(t, s.ClientURL())
	st := testutil.Store(t, nc)
	p := &InProcess{Desc: InProcessDescriptor("spawn", false)}
	bad := &InProcess{Desc: InProcessDescriptor("no.dots", false)}
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no connection", Config{Store: st, Providers: []Provider{p}}},
		{"no store", Config{NC: nc, Providers: []Provider{p}}},
		{"no provider", Config{NC: nc, Store: st}},
		{"a host id that is no id", Config{NC: nc, Store: st, Providers: []Provider{p}, HostID: "a.b"}},
		{"a provider name that is no id", Config{NC: nc, Store: st, Providers: []Provider{bad}}},
		{"a scope that names another provider", Config{NC: nc, Store: st, Providers: []Provider{p}, Scope: "other"}},
		{"a provider named root", Config{NC: nc, Store: st, Providers: []Provider{&InProcess{Desc: InProcessDescriptor(protocol.ScopeRoot, false)}}}},
	} {
		if _, err := New(tc.cfg); err == nil {
			t.Errorf("%s: New accepted it", tc.name)
		}
	}
	h, err := New(Config{NC: nc, Store: st, Providers: []Provider{p}})
	if err != nil {
		t.Fatal(err)
	}
	if !protocol.ValidWorkerHostID(h.ID()) || protocol.HostScope(h.ID()) != p.Descriptor().Name || h.cfg.HeartbeatInterval != protocol.DefaultHeartbeatInterval ||
		h.cfg.HostExpiry != protocol.DefaultHostExpiry || h.cfg.DrainGrace != DefaultDrainGrace {
		t.Errorf("defaults: id %q, heartbeat %s, expiry %s, drain grace %s", h.ID(), h.cfg.HeartbeatInterval, h.cfg.HostExpiry, h.cfg.DrainGrace)
	}
}

// A start runs the child's turn, settles the run by compare-and-set at the
// claim's revision, asks the coordinators to publish its notice (never
// publishing on the notify subject itself), and releases the lease; the same
// start sent again finds the record claimed and starts nothing.
func TestStartRunClaimsRunsSettlesAndPublishes(t *testing.T) {
	h, st, nc := testHost(t, nil)
	ctx := context.Background()
	direct := testutil.Subscribe(t, nc, "_INBOX.test.notices")
	requests := testutil.Subscribe(t, nc, st.Subj.NoticeAll())
	req := startRequest(t, st, "C1", "say ok", "_INBOX.test.notices")
	reply, err := h.startRun(ctx, h.cfg.Providers[0], req)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := reply.(protocol.ProviderStartReply); !ok || r.HostID != "spawn.H1" {
		t.Fatalf("reply %#v", reply)
	}
	if m := receiveNoticeRequest(t, requests); m.Subject != st.Subj.Notice("spawn", "C1") || len(m.Data) != 0 {
		t.Fatalf("notice request on %s with %d bytes, want %s with none", m.Subject, len(m.Data), st.Subj.Notice("spawn", "C1"))
	}
	// The request follows the settlement: a coordinator reading the run
	// then finds the result it publishes.
	run, err := st.RunLatest(ctx, "C1")
	if err != nil {
		t.Fatal(err)
	}
	if v := run.Value; v.State != protocol.RunSettled || v.HostID != "spawn.H1" || v.SettledBy != "spawn.H1" || v.StartedAt == 0 || v.NotStarted ||
		v.Result.StopReason != protocol.StopCompleted || protocol.PlainText(v.Result.Output) != "ok" {
		t.Fatalf("run record %+v", v)
	}
	waitRunDone(t, h)
	if len(direct) != 0 {
		t.Fatal("the host published on its caller's notify subject itself")
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, err := st.Lease(ctx, "C1")
		return errors.Is(err, store.ErrNotFound)
	}, "the lease of a settled run was not released")
	if _, err := h.startRun(ctx, h.cfg.Providers[0], req); protocol.CodeOf(err) != protocol.CodeNotPending {
		t.Fatalf("the same start again: %v, want NOT_PENDING", err)
	}
}

// A start whose deadline passed is dropped before anything is written: the
// run record keeps its revision and no lease is taken.
func TestStartRunDropsALateRequest(t *testing.T) {
	h, st, _ := testHost(t, nil)
	ctx := context.Background()
	req := startRequest(t, st, "C1", "say ok", "")
	req.Deadline = time.Now().Add(-time.Second).UnixMilli()
	if _, err := h.startRun(ctx, h.cfg.Providers[0], req); protocol.CodeOf(err) != protocol.CodeUnavailable {
		t.Fatalf("late start: %v, want UNAVAILABLE", err)
	}
	run, err := st.Run(ctx, "C1")
	if err != nil {
		t.Fatal(err)
	}
	if run.Revision != uint64(req.RunRevision) || run.Value.HostID != "" {
		t.Fatalf("the run record changed: revision %d (created at %d), %+v", run.Revision, req.RunRevision, run.Value)
	}
	if _, err := st.Lease(ctx, "C1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("lease: %v, want none", err)
	}
}

// A start whose child's header names another provider (or none) is
// refused before anything is written: the child's log lies in its header's
// provider's scope, which this provider's workers may not write
// (docs/security.md).
func TestStartRunRefusesAChildOfAnotherScope(t *testing.T) {
	h, st, _ := testHost(t, nil)
	ctx := context.Background()
	for i, provider := range []string{"fork", ""} {
		id := fmt.Sprintf("C%d", i)
		req := startRequest(t, st, id, "say ok", "")
		req.Header.Provider = provider
		if _, err := h.startRun(ctx, h.cfg.Providers[0], req); protocol.CodeOf(err) != protocol.CodeInvalidArgument {
			t.Fatalf("a child of provider %q: %v, want INVALID_ARGUMENT", provider, err)
		}
		run, err := st.Run(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if run.Revision != uint64(req.RunRevision) || run.Value.HostID != "" {
			t.Fatalf("the run record changed: revision %d (created at %d), %+v", run.Revision, req.RunRevision, run.Value)
		}
		if _, err := st.Lease(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("lease: %v, want none", err)
		}
	}
}

// A start of a run the coordinator already gave up on (settled never
// started at the creation revision) is fenced out by the claim.
func TestStartRunOfARunSettledMeanwhileIsNotPending(t *testing.T) {
	h, st, _ := testHost(t, nil)
	ctx := context.Background()
	req := startRequest(t, st, "C1", "say ok", "")
	won, err := st.SettleRun(ctx, store.NotStarted(req.Run, "COORD", protocol.Errorf(protocol.CodeUnavailable, "no instance answered")), uint64(req.RunRevision))
	if err != nil || !won {
		t.Fatalf("settle: %v, %v", won, err)
	}
	if _, err := h.startRun(ctx, h.cfg.Providers[0], req); protocol.CodeOf(err) != protocol.CodeNotPending {
		t.Fatalf("start: %v, want NOT_PENDING", err)
	}
	if _, err := st.Lease(ctx, "C1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("lease: %v, want none", err)
	}
}

// A start that fails after its claim (here the model cannot be built) is
// settled by the host as never started, with the failure's code, and the
// host asks the coordinators for the caller's notice; no lease is left behind.
func TestStartRunFailingAfterTheClaimSettlesNeverStarted(t *testing.T) {
	h, st, nc := testHost(t, func() (model.Model, error) { return nil, errors.New("no key") })
	ctx := context.Background()
	requests := testutil.Subscribe(t, nc, st.Subj.NoticeAll())
	req := startRequest(t, st, "C1", "say ok", "_INBOX.test.notices")
	if _, err := h.startRun(ctx, h.cfg.Providers[0], req); protocol.CodeOf(err) != protocol.CodeUnavailable {
		t.Fatalf("start: %v, want UNAVAILABLE", err)
	}
	if m := receiveNoticeRequest(t, requests); m.Subject != st.Subj.Notice("spawn", "C1") {
		t.Fatalf("notice request on %s, want %s", m.Subject, st.Subj.Notice("spawn", "C1"))
	}
	run, err := st.RunLatest(ctx, "C1")
	if err != nil {
		t.Fatal(err)
	}
	if v := run.Value; v.State != protocol.RunSettled || !v.NotStarted || v.SettledBy != "spawn.H1" || v.Result.ErrorCode != protocol.CodeUnavailable {
		t.Fatalf("run record %+v", v)
	}
	if _, err := st.Lease(ctx, "C1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("lease: %v, want none", err)
	}
}

// withDeadline bounds a request by its deadline, and by ClaimBudgetMax when
// it has none or a later one; a deadline that passed is UNAVAILABLE.
func TestWithDeadline(t *testing.T) {
	h := &Host{id: "H1", log: testutil.Logger(t)}
	now := time.Now()
	for _, tc := range []struct {
		name     string
		deadline int64
		within   time.Duration // the context's deadline is at most this far
		late     bool
	}{
		{"none", 0, ClaimBudgetMax, false},
		{"in a second", now.Add(time.Second).UnixMilli(), time.Second, false},
		{"in an hour", now.Add(time.Hour).UnixMilli(), ClaimBudgetMax, false},
		{"passed", now.Add(-time.Millisecond).UnixMilli(), 0, true},
	} {
		ctx, cancel, err := h.withDeadline(context.Background(), tc.deadline, "start", "R1")
		if tc.late {
			if protocol.CodeOf(err) != protocol.CodeUnavailable || ctx != nil {
				t.Errorf("%s: %v, want UNAVAILABLE and no context", tc.name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		d, ok := ctx.Deadline()
		if !ok || time.Until(d) > tc.within || time.Until(d) <= 0 {
			t.Errorf("%s: deadline in %s, want within %s", tc.name, time.Until(d), tc.within)
		}
		cancel()
	}
}

// TestLeaseReleaseRetriesOnlyWhatDidNotLand: a lease release that lands is
// done (nothing waits to be tried again, one delete sent); one JetStream
// refuses waits in the host's unsettled settlements, to be tried after the
// next heartbeat JetStream takes (claim.go, releaseLease).
func TestLeaseReleaseRetriesOnlyWhatDidNotLand(t *testing.T) {
	h, st, _ := testHost(t, nil)
	ctx := context.Background()
	var deletes, refused atomic.Int32
	h.st = st.WithFaults(store.Faults{Before: func(_ context.Context, w store.Write) error {
		if w.Op != store.OpKVDelete {
			return nil
		}
		deletes.Add(1)
		if w.Key == store.LeaseKey("spawn", "refused") {
			refused.Add(1)
			return errors.New("jetstream down")
		}
		return nil
	}})
	waiting := func() []string {
		h.unsettled.mu.Lock()
		defer h.unsettled.mu.Unlock()
		return append([]string(nil), h.unsettled.order...)
	}
	for _, id := range []string{"landed", "refused"} {
		rev, err := st.CreateLease(ctx, protocol.AgentRecord{SessionID: id, Kind: protocol.AgentContinuable, HostID: "H1", Epoch: 1, Provider: "spawn", CreatedAt: store.NowMs()})
		if err != nil {
			t.Fatal(err)
		}
		h.releaseLease("spawn", id, rev)
		if id == "landed" {
			if _, err := store.Get[protocol.AgentRecord](ctx, st.Agents, store.LeaseKey("spawn", id)); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("the released lease: %v, want it gone", err)
			}
			if w := waiting(); len(w) != 0 || deletes.Load() != 1 {
				t.Fatalf("a release that landed: %d deletes sent, waiting %v; want one and nothing", deletes.Load(), w)
			}
		}
	}
	if w := waiting(); len(w) != 1 || w[0] != store.LeaseKey("spawn", "refused") || refused.Load() == 0 {
		t.Fatalf("a refused release: waiting %v after %d attempts; want it waiting", w, refused.Load())
	}
}
