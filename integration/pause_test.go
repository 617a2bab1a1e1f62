package integration

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
)

// logSeen is a slog handler that remembers the messages it passed on.
type logSeen struct {
	slog.Handler
	mu   *sync.Mutex
	msgs *[]string
}

func newLogSeen(next slog.Handler) logSeen {
	return logSeen{Handler: next, mu: &sync.Mutex{}, msgs: &[]string{}}
}

func (l logSeen) Handle(ctx context.Context, r slog.Record) error {
	l.mu.Lock()
	*l.msgs = append(*l.msgs, r.Message)
	l.mu.Unlock()
	return l.Handler.Handle(ctx, r)
}

func (l logSeen) WithAttrs(as []slog.Attr) slog.Handler {
	return logSeen{Handler: l.Handler.WithAttrs(as), mu: l.mu, msgs: l.msgs}
}

func (l logSeen) WithGroup(g string) slog.Handler {
	return logSeen{Handler: l.Handler.WithGroup(g), mu: l.mu, msgs: l.msgs}
}

// count is how many messages so far contain s.
func (l logSeen) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range *l.msgs {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}

// spawnInstances waits until the coordinators list n spawn instances.
func spawnInstances(t *testing.T, s *stack.Stack, n int, within time.Duration) {
	t.Helper()
	testutil.Eventually(t, within, func() bool {
		r, err := s.Client.Providers(context.Background())
		return err == nil && r.Instances["spawn"] == n
	}, "%d spawn instances listed", n)
}

// timedRun runs prompt on spawn and returns its result and how long the
// start took (the result of `say` follows at once).
func timedRun(t *testing.T, s *stack.Stack, parent protocol.ParentRef, prompt string) (string, protocol.SubagentResult, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	began := time.Now()
	run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: parent, Prompt: protocol.Text(prompt)})
	took := time.Since(began)
	if err != nil {
		t.Fatalf("start after %s: %v", took.Round(time.Millisecond), err)
	}
	res, err := run.Result(ctx)
	if err != nil {
		t.Fatalf("result of %s: %v", run.RunID, err)
	}
	return run.RunID, res, took
}

// TestPausedWorkerIsNotDispatchedTo (issue 16, fault 1): a second spawn
// worker is paused (SIGSTOP to its own process group) until the
// coordinator no longer lists it; six runs then all complete promptly. Through
// the provider's queue group, the runs it picked waited for the whole start
// timeout and ended UNAVAILABLE, since a paused member keeps its subscription.
func TestPausedWorkerIsNotDispatchedTo(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	w2 := spawnWorkerGroup(t, s.URL, stack.HostExpiry)
	spawnInstances(t, s, 2, 10*time.Second)
	w2.signal(t, syscall.SIGSTOP)
	spawnInstances(t, s, 1, 10*time.Second)
	root := s.Root()
	for i := 0; i < 6; i++ {
		_, res, took := timedRun(t, s, root.Ref(), "say hi")
		if res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != "hi" {
			t.Fatalf("run %d: %+v", i, res)
		}
		if took > 3*time.Second {
			t.Fatalf("run %d took %s to start with one live instance", i, took)
		}
	}
}

// TestPausedWorkerCostsOneAttempt (issue 16, faults 1 and 2): a paused worker
// that still counts as live (its host expiry has not passed) costs a run at
// most one attempt: the start goes on to the other instance within the
// coordinator's budget, and the paused one is tried last afterwards. Once it
// resumes, it drops every start whose deadline passed while it was stopped:
// it claims, writes and emits nothing for them, so every run ran on the other
// worker and every subagent/start has exactly one subagent/end.
func TestPausedWorkerCostsOneAttempt(t *testing.T) {
	const expiry = 30 * time.Second // the paused worker stays "live" throughout
	const attempt = 2 * time.Second
	s := stack.New(t)
	seen := newLogSeen(testutil.Logger(t).Handler())
	s.AddCoordinator(func(c *coordinatorConfig) {
		c.HostExpiry, c.ProviderAttemptTimeout, c.Logger = expiry, attempt, slog.New(seen)
	})
	w1, _ := s.AddSpawnWorker(func(c *worker.InProcessConfig) { c.HostExpiry = expiry })
	w2 := spawnWorkerGroup(t, s.URL, expiry)
	spawnInstances(t, s, 2, 10*time.Second)
	root := s.Root()
	w2.signal(t, syscall.SIGSTOP)

	var runs []string
	for i := 0; i < 12 && (i < 6 || seen.count("did not answer in time") == 0); i++ {
		runID, res, took := timedRun(t, s, root.Ref(), "say hi")
		runs = append(runs, runID)
		if res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != "hi" {
			t.Fatalf("run %d: %+v", i, res)
		}
		if took > attempt+3*time.Second {
			t.Fatalf("run %d took %s to start: more than one attempt of %s", i, took, attempt)
		}
	}
	timedOut := seen.count("did not answer in time")
	if timedOut == 0 {
		t.Fatalf("no run was offered to the paused worker in %d runs", len(runs))
	}
	if timedOut > 1 {
		t.Errorf("the paused worker let %d attempts time out; once suspected it is tried last", timedOut)
	}

	w2.signal(t, syscall.SIGCONT)
	w2.waitStderr(t, "arrived after its deadline", 10*time.Second)
	// Every run ran on w1; the resumed worker claimed none and emitted nothing.
	ctx := context.Background()
	for _, id := range runs {
		rec, err := s.Store.Run(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Value.HostID != w1.ID() || rec.Value.State != protocol.RunSettled || rec.Value.SettledBy != w1.ID() {
			t.Fatalf("run %s: host %q settled by %q (%s); want all on %s", id, rec.Value.HostID, rec.Value.SettledBy, rec.Value.State, w1.ID())
		}
	}
	balanced := func() string {
		starts, ends := map[string]int{}, map[string]int{}
		for _, ev := range s.Lifecycle(root.SessionID) {
			if ev.Type == protocol.LifecycleStart {
				starts[ev.RunID]++
			} else {
				ends[ev.RunID]++
			}
		}
		for _, id := range runs {
			if starts[id] != 1 || ends[id] != 1 {
				return id
			}
		}
		if len(starts) != len(runs) || len(ends) != len(runs) {
			return "extra runs"
		}
		return ""
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return balanced() == "" }, "one start and one end per run")
	// Anything the resumed worker would still emit shows up meanwhile.
	testutil.Consistently(t, time.Second, func() bool { return balanced() == "" }, "lifecycle events stay balanced after the resume")
	if bad := balanced(); bad != "" {
		t.Fatalf("lifecycle events unbalanced after the resume: %s", bad)
	}
	if strings.Contains(w2.Stderr(), "panic") {
		t.Fatal("the resumed worker panicked")
	}
}

// TestStaleStartIsDropped (issue 16, fault 2): the only spawn worker is
// paused, so a start's attempts at it time out and the coordinator settles
// the run never started and answers UNAVAILABLE within the client's
// timeout. When the worker resumes, the starts it was sent are past their
// deadline: it drops them, so the child's log stays empty, the run record
// stays settled never started, and no subagent/start (which would never have
// its subagent/end) is emitted. Before, the resumed worker ran the child and
// emitted subagent/start for a run already settled.
func TestStaleStartIsDropped(t *testing.T) {
	const expiry = 30 * time.Second
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinatorConfig) { c.HostExpiry, c.ProviderAttemptTimeout = expiry, time.Second })
	w := spawnWorkerGroup(t, s.URL, expiry)
	spawnInstances(t, s, 1, 10*time.Second)
	root := s.Root()
	w.signal(t, syscall.SIGSTOP)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	began := time.Now()
	_, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text("say stale")})
	cancel()
	if !errors.Is(err, protocol.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("start with the only worker paused after %s: %v; want the coordinator's own UNAVAILABLE", time.Since(began), err)
	}
	// The coordinator settled the run never started.
	var runs []protocol.RunRecord
	testutil.Eventually(t, 15*time.Second, func() bool {
		runs = runRecords(t, s)
		return len(runs) == 1 && runs[0].State == protocol.RunSettled
	}, "the run settled never started")
	if !runs[0].NotStarted || runs[0].Result == nil || runs[0].Result.ErrorCode != protocol.CodeUnavailable {
		t.Fatalf("run record %+v", runs[0])
	}

	w.signal(t, syscall.SIGCONT)
	testutil.Eventually(t, 10*time.Second, func() bool {
		return strings.Contains(w.Stderr(), "arrived after its deadline") || len(s.Lifecycle(root.SessionID)) > 0
	}, "the resumed worker handles the stale start")
	// Anything it would still write or emit shows up meanwhile.
	testutil.Consistently(t, time.Second, func() bool { return len(s.Lifecycle(root.SessionID)) == 0 }, "no lifecycle event for a run that never started")
	if evs := s.Lifecycle(root.SessionID); len(evs) > 0 {
		t.Fatalf("the resumed worker emitted %d lifecycle events for a run settled never started (first %s)", len(evs), evs[0].Type)
	}
	if _, evs := s.Log(runs[0].ChildID); len(evs) > 0 {
		t.Fatalf("the resumed worker wrote %d events to the log of a child that never started", len(evs))
	}
	if got := runRecords(t, s); len(got) != 1 || got[0].State != protocol.RunSettled || !got[0].NotStarted {
		t.Fatalf("run records after the resume: %+v", got)
	}
}

// runRecords reads every record of brood_runs.
func runRecords(t *testing.T, s *stack.Stack) []protocol.RunRecord {
	t.Helper()
	ctx := context.Background()
	lister, err := s.Store.Runs.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []protocol.RunRecord
	for k := range lister.Keys() {
		if store.RunIDOf(k) == "" {
			continue // a run is listed once, by its spec
		}
		rec, err := s.Store.Run(ctx, store.RunIDOf(k))
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rec.Value)
	}
	return out
}

// TestSilentProviderIsUnavailableNotMissing (issue 16, fault 4): while the
// only instance of a provider is registered but silent (paused here; its
// heartbeats held up by a leader election alike), a start is refused
// UNAVAILABLE, which a client retries; NO_PROVIDER is only for a provider no
// host registered.
func TestSilentProviderIsUnavailableNotMissing(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	w := spawnWorkerGroup(t, s.URL, stack.HostExpiry)
	spawnInstances(t, s, 1, 10*time.Second)
	root := s.Root()
	w.signal(t, syscall.SIGSTOP)
	spawnInstances(t, s, 0, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text("say hi")})
	if !errors.Is(err, protocol.ErrUnavailable) {
		t.Fatalf("start with the only spawn instance silent = %v, want UNAVAILABLE", err)
	}
	if _, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Provider: "nope", Parent: root.Ref(), Prompt: protocol.Text("say hi")}); !errors.Is(err, protocol.ErrNoProvider) {
		t.Fatalf("start on a provider nobody registered = %v, want NO_PROVIDER", err)
	}
	w.signal(t, syscall.SIGCONT)
	spawnInstances(t, s, 1, 10*time.Second)
	if _, res, _ := timedRun(t, s, root.Ref(), "say back"); protocol.PlainText(res.Output) != "back" {
		t.Fatalf("run after the resume: %+v", res)
	}
}
