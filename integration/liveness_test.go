package integration

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/embedded"
	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// syncBuffer is a log sink shared by goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestServerRestartIsNotHostLoss (issue 16, fault 3): a separate coordinator
// process and a separate spawn-worker process, with the production timing
// (heartbeat 1 s, host expiry 5 s), against a server that is stopped for
// longer than the host expiry and restarted on the same store and port, while
// continuable children sleep across the restart. A coordinator that was cut
// off itself, or whose watch restarted, must not count that time against the
// worker: no `host lost`, no child settled HOST_LOST, the provider listed
// again promptly by every coordinator, and the children complete. A
// coordinator started fresh after the restart (as `brood dev` starts its own)
// must not judge the worker from the records it finds either.
func TestServerRestartIsNotHostLoss(t *testing.T) {
	dir := t.TempDir()
	port, err := embedded.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	startServer := func() *embedded.Server {
		srv, err := embedded.Start(embedded.Config{Host: "127.0.0.1", Port: port, DataDir: dir, ServerName: "restart"})
		if err != nil {
			t.Fatal(err)
		}
		return srv
	}
	srv := startServer()
	s := stack.On(t, srv)
	url := srv.ClientURL()

	// The coordinator in this process stands for brood dev's own: it stops
	// with the server and a fresh one starts after the restart.
	var devLog syncBuffer
	startDevCoordinator := func() func() {
		c, err := coordinator.New(coordinator.Config{NC: s.Conn(), Store: s.Store,
			Logger: slog.New(slog.NewTextHandler(&devLog, &slog.HandlerOptions{Level: slog.LevelInfo}))})
		if err != nil {
			t.Fatal(err)
		}
		stop := testutil.Background(t, c)
		select {
		case <-c.Ready():
		case <-time.After(20 * time.Second):
			t.Fatal("coordinator not serving after 20s")
		}
		return stop
	}
	stopDev := startDevCoordinator()
	coord := startProc(t, "coordinator", "--nats", url, "--log-level", "info")
	coord.waitStderr(t, "coordinator serving", 20*time.Second)
	w := startProc(t, "spawn-worker", "--nats", url, "--log-level", "info", "--model", "scripted")
	w.waitStderr(t, "host serving", 20*time.Second)
	s.WaitProvider("spawn")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log of the in-process coordinator:\n%s", devLog.String())
		}
	})

	root := s.Root()
	const children = 6
	var kids []protocol.ContinuableStartReply
	for i := 0; i < children; i++ {
		kids = append(kids, startCont(t, s, root.Ref(), "sleep 14s\nsay done"))
	}
	for _, k := range kids {
		testutil.Eventually(t, 20*time.Second, func() bool {
			_, evs := s.Log(k.ChildID)
			claims, _, _ := turnsOf(evs)
			return len(claims) == 1
		}, "child %s runs its first turn", k.ChildID)
	}

	// Down for longer than the host expiry: nobody can write a heartbeat.
	stopDev()
	srv.Shutdown()
	const downtime = 6 * time.Second
	time.Sleep(downtime) // the fault's duration, not a wait for a condition
	srv = startServer()
	t.Cleanup(srv.Shutdown)
	stopDev = startDevCoordinator()
	defer stopDev()

	// Every coordinator lists the provider again promptly, and keeps listing it.
	listed := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, err := s.Client.Providers(ctx)
		return err == nil && r.Instances["spawn"] > 0
	}
	testutil.Eventually(t, 10*time.Second, listed, "the provider is listed after the restart")
	for _, k := range kids {
		testutil.Eventually(t, 60*time.Second, func() bool {
			if !listed() {
				t.Fatalf("a coordinator answered without the live spawn provider after the restart")
			}
			st, err := s.Client.State(context.Background(), protocol.ChildRef{ChildID: k.ChildID, Authority: ref(root)})
			return err == nil && st.State == protocol.StateNone // UNAVAILABLE until the worker is back
		}, "child %s settles", k.ChildID)
	}

	for _, k := range kids {
		_, evs := s.Log(k.ChildID)
		claims, answers, ends := turnsOf(evs)
		if len(claims) != 1 || strings.Join(answers, ",") != "done" || strings.Join(ends, ",") != protocol.TurnCompleted {
			t.Errorf("child %s: claims %v answers %v ends %v; want its one turn completed", k.ChildID, claims, answers, ends)
		}
	}
	for _, ev := range lifecycleOf(t, s, root.SessionID) {
		if ev.Type == protocol.LifecycleEnd && ev.ErrorCode == protocol.CodeHostLost {
			t.Errorf("child %s settled %s with HOST_LOST", ev.ID, ev.StopReason)
		}
	}
	for name, log := range map[string]string{"coordinator process": coord.Stderr(), "in-process coordinator": devLog.String()} {
		if strings.Contains(log, "host lost") {
			t.Errorf("the %s declared the live worker lost", name)
		}
	}
}

// gatedProvider is an in-process provider whose activations hang while it
// is gated (a provider instance that takes a start and never answers).
type gatedProvider struct {
	worker.Provider
	gated   atomic.Bool
	release chan struct{}
}

func (g *gatedProvider) NewSession(ctx context.Context, spec worker.SessionSpec) (worker.Session, error) {
	if g.gated.Load() {
		select {
		case <-g.release:
		case <-ctx.Done():
		}
		return nil, protocol.Errorf(protocol.CodeUnavailable, "the gated provider never answered")
	}
	return g.Provider.NewSession(ctx, spec)
}

// TestLivenessResumesDoNotWaitForEachOther (issue 16, fault 6; L1): accepted
// messages of children with no live activation run within the stated bound
// (a liveness sweep, then one resume) when nothing stops them, even while
// other children's resumes hang on a provider that does not answer: one
// resume never waits for another.
func TestLivenessResumesDoNotWaitForEachOther(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinatorConfig) { c.ProviderAttemptTimeout, c.RequestBudget = 30*time.Second, 30*time.Second })
	s.AddSpawnWorker()
	g := &gatedProvider{release: make(chan struct{}), Provider: &worker.InProcess{
		Desc:   protocol.ProviderDescriptor{Name: "gated", Continuable: true, Tools: []string{}},
		Models: func() (model.Model, error) { return model.NewScripted(), nil },
		Tools:  func(worker.SessionSpec) ([]*agent.Tool, error) { return nil, nil },
	}}
	s.AddHost(g)
	t.Cleanup(func() { close(g.release) })
	root := s.Root()
	ctx := context.Background()
	const each = 4
	var gated, free []string
	for i := 0; i < each; i++ {
		for _, p := range []string{"gated", "spawn"} {
			c, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: p, Parent: root.Ref(), Label: p, Prompt: protocol.Text("say first")})
			if err != nil {
				t.Fatalf("start on %s: %v", p, err)
			}
			if p == "gated" {
				gated = append(gated, c.ChildID)
			} else {
				free = append(free, c.ChildID)
			}
		}
	}
	for _, id := range append(append([]string(nil), gated...), free...) {
		waitState(t, s, id, ref(root), protocol.StateNone, 20*time.Second)
	}
	// Items accepted while no activation is live (as after a host died):
	// the gated provider now hangs on every activation.
	g.gated.Store(true)
	want := map[string]string{}
	for _, id := range append(append([]string(nil), gated...), free...) {
		mid, _, err := s.Store.Enqueue(ctx, testutil.ScopeOf(t, s.Store, id), id, storeItem("say again"), "")
		if err != nil {
			t.Fatal(err)
		}
		want[id] = mid
	}
	enqueued := time.Now()
	for _, id := range free {
		testutil.Eventually(t, 15*time.Second, func() bool {
			_, evs := s.Log(id)
			claims, _, _ := turnsOf(evs)
			return len(claims) == 2 && claims[1] == want[id]
		}, "the accepted item of %s runs although other resumes hang", id)
	}
	t.Logf("every free child's item was claimed %s after it was accepted", time.Since(enqueued))
}

// TestResumedChildReleasesItsParentsOwnership (issue 16, the loaded-run
// failure of TestSendMessageAndInterruptTools): a continuable parent sent its
// child a message while the child's epoch was ending; the followup
// registered the parent's ownership of the child again after that epoch had
// released it, and the liveness sweep resumed the child for the message. The
// resumed epoch must release the edge when it ends, or the parent waits for
// a child that is gone, forever.
//
// The parent is held in a turn of its own while its child is resumed, so
// that it is a live continuable owner then: its first turn cannot be relied
// on for that. Its background child's settlement notice joins the parent's
// turn at its next step, and a scripted parent answers that notice and ends
// its turn; under load the child ended before the parent's second step began
// (the parent's epoch settled 30 ms after the child's, instead of sleeping
// 4 s), the sweep then resumed the child with no owner, as it must for a
// parent that is gone, and the edge the test registered stayed.
func TestResumedChildReleasesItsParentsOwnership(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinatorConfig) { c.LivenessInterval = 300 * time.Millisecond })
	s.AddSpawnWorker()
	root := s.Root()
	user := grant(t, s)
	ctx := context.Background()
	parent := startCont(t, s, root.Ref(),
		"call subagent {\"description\":\"quick\",\"prompt\":\"say hi\",\"run_in_background\":true}\nsay started")
	var child string
	testutil.Eventually(t, 15*time.Second, func() bool {
		_, evs := s.Log(parent.ChildID)
		for _, ev := range evs {
			var d protocol.ToolResultData
			if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.Meta["childId"] != "" {
				child = d.Meta["childId"]
			}
		}
		return child != "" && state(t, s, child, user) == protocol.StateNone
	}, "the child ran and its epoch ended")
	// A turn of the parent's that lasts until the test interrupts it: the
	// parent is live (resident, or resumed for it) while its child is.
	held := followup(t, s, parent.ChildID, ref(root), "sleep 120s\nsay done")
	testutil.Eventually(t, 15*time.Second, func() bool {
		_, evs := s.Log(parent.ChildID)
		claims, _, _ := turnsOf(evs)
		return len(claims) > 0 && claims[len(claims)-1] == held
	}, "the parent's held turn runs")
	// The interleaving seen under load: the parent's followup registers the
	// edge after the ended epoch released it, and its message waits for the
	// liveness sweep.
	if err := s.Store.AddOwnership(ctx, parent.ChildID, child); err != nil {
		t.Fatal(err)
	}
	mid, _, err := s.Store.Enqueue(ctx, testutil.ScopeOf(t, s.Store, child), child, store.InboxItem{Content: protocol.Text("say again"),
		Source: protocol.MessageSource{Kind: protocol.SourceCoordinator, Form: "relay", SenderSessionID: parent.ChildID}, Delivery: store.DeliveryNextTurn}, "")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 15*time.Second, func() bool {
		_, evs := s.Log(child)
		claims, _, _ := turnsOf(evs)
		return len(claims) == 2 && claims[1] == mid && state(t, s, child, user) == protocol.StateNone
	}, "the child is resumed for the message and its epoch ends")
	// The resumed epoch released the edge itself: its parent still runs.
	if st := state(t, s, parent.ChildID, ref(root)); st != protocol.StateRunning {
		t.Fatalf("the parent is %s during its held turn; want %s", st, protocol.StateRunning)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		rec, err := store.Get[protocol.OwnershipRecord](ctx, s.Store.Agents, store.OwnsKey("spawn", parent.ChildID))
		return errors.Is(err, store.ErrNotFound) || (err == nil && len(rec.Value.Children) == 0)
	}, "the resumed child's end releases its parent's ownership")
	// And the parent, its held turn stopped and a last one answered, waits
	// for no child: its epoch ends.
	if _, err := s.Client.Interrupt(ctx, protocol.InterruptRequest{ChildID: parent.ChildID, Authority: user}); err != nil {
		t.Fatal(err)
	}
	followup(t, s, parent.ChildID, ref(root), "say done")
	waitState(t, s, parent.ChildID, ref(root), protocol.StateNone, 20*time.Second)
}

// TestOwnerlessEpochReleasesItsParentsEdge: a cold resume registers the
// parent's ownership edge before it activates the child, and a resume that
// failed keeps it for the epoch that eventually runs the child. When the
// liveness sweep starts that epoch while the parent is not live, the epoch
// names no owner; its end must still remove the edge, or the parent's next
// epoch waits for a child that is gone, forever (TestYourProviderUnderFaults:
// I6, the parent's epoch running with its lease held by a live host, its
// record owns.<parent> listing a child settled long before).
func TestOwnerlessEpochReleasesItsParentsEdge(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinatorConfig) { c.LivenessInterval = 300 * time.Millisecond })
	s.AddSpawnWorker()
	root := s.Root()
	user := grant(t, s)
	ctx := context.Background()
	parent := startCont(t, s, root.Ref(),
		"call subagent {\"description\":\"quick\",\"prompt\":\"say hi\",\"run_in_background\":true}\nsay started")
	var child string
	testutil.Eventually(t, 15*time.Second, func() bool {
		_, evs := s.Log(parent.ChildID)
		for _, ev := range evs {
			var d protocol.ToolResultData
			if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.Meta["childId"] != "" {
				child = d.Meta["childId"]
			}
		}
		return child != "" && state(t, s, child, user) == protocol.StateNone
	}, "the child ran and its epoch ended")
	waitState(t, s, parent.ChildID, ref(root), protocol.StateNone, 20*time.Second)
	// A cold resume of the child registered the edge, and its activation
	// failed; the message it was for waits for the liveness sweep, which
	// finds the parent not live and resumes the child with no owner.
	if err := s.Store.AddOwnership(ctx, parent.ChildID, child); err != nil {
		t.Fatal(err)
	}
	mid, _, err := s.Store.Enqueue(ctx, testutil.ScopeOf(t, s.Store, child), child, store.InboxItem{Content: protocol.Text("say again"),
		Source: protocol.MessageSource{Kind: protocol.SourceCoordinator, Form: "relay", SenderSessionID: parent.ChildID}, Delivery: store.DeliveryNextTurn}, "")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 15*time.Second, func() bool {
		_, evs := s.Log(child)
		claims, _, _ := turnsOf(evs)
		return slices.Contains(claims, mid) && state(t, s, child, user) == protocol.StateNone
	}, "the child is resumed for the message and its epoch ends")
	testutil.Eventually(t, 10*time.Second, func() bool {
		rec, err := store.Get[protocol.OwnershipRecord](ctx, s.Store.Agents, store.OwnsKey("spawn", parent.ChildID))
		return errors.Is(err, store.ErrNotFound) || (err == nil && !slices.Contains(rec.Value.Children, child))
	}, "the ended epoch removed its parent's edge")
	followup(t, s, parent.ChildID, ref(root), "say more")
	waitState(t, s, parent.ChildID, ref(root), protocol.StateNone, 20*time.Second)
}

// TestOwnershipEdgeOutlivesAnUnavailableBucket: a child's epoch ends while
// the removal of its parent's ownership edge keeps failing (the
// coordinator's writes to owns.<parent>, which it makes for the host at the
// epoch's end, get no answer, so it answers the host UNAVAILABLE). The host
// keeps the child's lease and asks again; once the removal lands, the
// lease goes and the parent, which owns no live child any more, settles.
// Before, the host let the edge go unremoved and released the lease: the
// parent's epoch waited for good with its lease held by a live host (make
// test's chaos seed 1, loaded: I6 and I7, "release ownership ... context
// deadline exceeded").
func TestOwnershipEdgeOutlivesAnUnavailableBucket(t *testing.T) {
	s := stack.New(t)
	var failing atomic.Bool
	var ownsKey atomic.Value
	ownsKey.Store("")
	s.AddCoordinator(func(c *coordinator.Config) {
		c.Store = c.Store.WithFaults(store.Faults{Before: func(_ context.Context, w store.Write) error {
			if failing.Load() && (w.Op == store.OpKVUpdate || w.Op == store.OpKVDelete) && w.Key == ownsKey.Load().(string) {
				return jetstream.ErrNoStreamResponse // no answer: retried, then given up
			}
			return nil
		}})
	})
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	root := s.Root()
	user := grant(t, s)
	ctx := context.Background()
	failing.Store(true)
	parent := startCont(t, s, root.Ref(),
		"call subagent {\"description\":\"quick\",\"prompt\":\"say hi\",\"run_in_background\":true}\nsleep 2s\nsay done")
	ownsKey.Store(store.OwnsKey("spawn", parent.ChildID))
	var child string
	testutil.Eventually(t, 60*time.Second, func() bool {
		_, evs := s.Log(parent.ChildID)
		for _, ev := range evs {
			var d protocol.ToolResultData
			if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.Meta["childId"] != "" {
				child = d.Meta["childId"]
			}
		}
		if child == "" {
			return false
		}
		for _, ev := range s.Lifecycle(parent.ChildID) {
			if ev.Type == protocol.LifecycleEnd && ev.ID == child {
				return true
			}
		}
		return false
	}, "the child's epoch ends while its parent's ownership edge cannot be removed")
	if _, err := store.Get[protocol.AgentRecord](ctx, s.Store.Agents, store.LeaseKey("spawn", child)); err != nil {
		t.Fatalf("the child's lease is gone while its parent's edge was kept: %v", err)
	}
	if state(t, s, parent.ChildID, user) == protocol.StateNone {
		t.Fatal("the parent settled while it owned the child")
	}
	failing.Store(false)
	waitState(t, s, parent.ChildID, ref(root), protocol.StateNone, 30*time.Second)
	if rec, err := store.Get[protocol.OwnershipRecord](ctx, s.Store.Agents, store.OwnsKey("spawn", parent.ChildID)); err == nil && len(rec.Value.Children) > 0 {
		t.Fatalf("the parent still owns %v", rec.Value.Children)
	}
	testutil.Eventually(t, 15*time.Second, func() bool {
		_, err := store.Get[protocol.AgentRecord](ctx, s.Store.Agents, store.LeaseKey("spawn", child))
		return errors.Is(err, store.ErrNotFound)
	}, "the child's lease released once the edge was removed")
}
