package coordinator_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// TestOneUserAtItsWaitLimitsTakesNothingFromAnother (issue 29, item 4):
// one user holds long polls (sessions.log and inbox.read with waitMs) and
// follows at its limits, and asks for more than the replica has request
// slots; the long polls past its limit and the follows past its limit are
// LIMIT_EXCEEDED at once, and meanwhile another user's renewals, runs and
// disposes complete within their usual latency (the same operations
// measured before the first user began). Before, each waiting long poll
// held one of the replica's RequestsInFlightMax slots: with them all
// taken, the other user's requests waited until the polls ended (60 s),
// past their roots' lease.
func TestOneUserAtItsWaitLimitsTakesNothingFromAnother(t *testing.T) {
	const (
		slots         = 4  // RequestsInFlightMax
		userPolls     = 6  // UserLongPollsMax: more than the slots, which waiting polls must not hold
		userFollows   = 3  // UserFollowsMax
		pollsAsked    = 16 // past both
		followsAsked  = userFollows + 3
		rounds        = 3
		latencyBudget = 3 * time.Second // each operation with the hog present, on a loaded 2-core machine
	)
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) {
		c.RequestsInFlightMax, c.UserLongPollsMax, c.UserFollowsMax = slots, userPolls, userFollows
	})
	s.AddSpawnWorker()
	hog, victim := userClient(t, s, "hog"), userClient(t, s, "victim")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	victimRoot, err := openAs(ctx, t, victim)
	if err != nil {
		t.Fatal(err)
	}
	// One round of the victim's work: a renewal, a run to its result, and
	// the dispose of a run still running; the time each took.
	round := func() (renew, run, dispose time.Duration) {
		t.Helper()
		began := time.Now()
		if _, err := victimRoot.Renew(ctx); err != nil {
			t.Fatalf("renew: %v", err)
		}
		renew = time.Since(began)
		began = time.Now()
		r, err := victim.StartRun(ctx, protocol.RunStartRequest{Parent: victimRoot.Ref(), Provider: "spawn", Prompt: protocol.Text("say done")})
		if err != nil {
			t.Fatalf("start: %v", err)
		}
		if res, err := r.Result(ctx); err != nil || protocol.PlainText(res.Output) != "done" {
			t.Fatalf("run: %+v, %v", res, err)
		}
		run = time.Since(began)
		long, err := victim.StartRun(ctx, protocol.RunStartRequest{Parent: victimRoot.Ref(), Provider: "spawn", Prompt: protocol.Text("sleep 60s\nsay late")})
		if err != nil {
			t.Fatalf("start: %v", err)
		}
		began = time.Now()
		if st, err := long.Dispose(ctx); err != nil || st.State != protocol.RunSettled {
			t.Fatalf("dispose: %+v, %v", st, err)
		}
		dispose = time.Since(began)
		return renew, run, dispose
	}
	measure := func(what string) (worst time.Duration) {
		var all []string
		for range rounds {
			renew, run, dispose := round()
			worst = max(worst, renew, run, dispose)
			all = append(all, "renew "+renew.Round(time.Millisecond).String()+", run "+run.Round(time.Millisecond).String()+", dispose "+dispose.Round(time.Millisecond).String())
		}
		t.Logf("%s: %s", what, strings.Join(all, "; "))
		return worst
	}
	usual := measure("the victim alone")

	// The hog: a root, and its long polls on its own empty log and inbox.
	hogRoot, err := openAs(ctx, t, hog)
	if err != nil {
		t.Fatal(err)
	}
	hogNC, err := nats.Connect(s.URL, nats.CustomInboxPrefix(protocol.UserInboxPrefix("hog")))
	if err != nil {
		t.Fatal(err)
	}
	defer hogNC.Close()
	pollCtx, stopPolls := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var refusedPolls []string
	for i := range pollsAsked {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if i%2 == 0 {
				err = rpc.Call(pollCtx, hogNC, s.Store.Subj.User("hog", protocol.EpSessionsLog),
					protocol.LogReadRequest{SessionID: hogRoot.SessionID, Authority: hogRoot.Authority(), WaitMs: protocol.ReadWaitMsMax}, nil)
			} else {
				err = rpc.Call(pollCtx, hogNC, s.Store.Subj.User("hog", protocol.EpInboxRead),
					protocol.InboxReadRequest{SessionID: hogRoot.SessionID, Authority: hogRoot.Authority(), WaitMs: protocol.ReadWaitMsMax}, nil)
			}
			if protocol.CodeOf(err) == protocol.CodeLimitExceeded {
				mu.Lock()
				refusedPolls = append(refusedPolls, err.Error())
				mu.Unlock()
			}
		}()
	}
	defer func() { stopPolls(); wg.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(refusedPolls)
		mu.Unlock()
		if n == pollsAsked-userPolls {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the hog's %d long polls refused within 30 s, want %d (its limit %d)", n, pollsAsked, pollsAsked-userPolls, userPolls)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(refusedPolls[0], "long polls per user") {
		t.Fatalf("a long poll past the user's limit: %s", refusedPolls[0])
	}
	var follows []*client.Follow
	defer func() {
		for _, f := range follows {
			f.Close()
		}
	}()
	for i := range followsAsked {
		f, err := hog.Follow(ctx, protocol.EventsFollowRequest{Parent: hogRoot.SessionID, Authority: hogRoot.Authority()})
		switch {
		case i < userFollows && err != nil:
			t.Fatalf("follow %d of the hog: %v", i+1, err)
		case i >= userFollows && (protocol.CodeOf(err) != protocol.CodeLimitExceeded || !strings.Contains(err.Error(), "follows per user")):
			t.Fatalf("follow %d of the hog, past its limit of %d: %v, want LIMIT_EXCEEDED (follows per user)", i+1, userFollows, err)
		case err == nil:
			follows = append(follows, f)
		}
	}

	worst := measure("the victim beside the hog at its limits")
	if worst > max(latencyBudget, 3*usual) {
		t.Fatalf("the victim's slowest operation beside the hog took %s (alone: %s)", worst, usual)
	}
	// The hog's own short reads still pass (they hold no wait slot).
	if _, err := hog.Inbox(ctx, protocol.InboxReadRequest{SessionID: hogRoot.SessionID, Authority: hogRoot.Authority()}); err != nil {
		t.Fatalf("a short read of the hog at its long-poll limit: %v", err)
	}
}

// TestAUsersStoredPromptBytesAreBounded (issue 29, item 4): the prompts one
// user stores through a replica are charged to its bucket of prompt bytes;
// a start past it is LIMIT_EXCEEDED (prompt bytes per user) and stores
// nothing (no child), while another user's and an anonymous caller's
// starts go on. Before, accepted prompts had no per-user bound.
func TestAUsersStoredPromptBytesAreBounded(t *testing.T) {
	const (
		burst      = 3000 // UserPromptBytesBurst
		promptSize = 1000 // each start's body is a little more: two fit, the third does not
	)
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) {
		c.UserPromptBytesBurst, c.UserPromptBytesPerSecond = burst, 1 // no refill to speak of within the test
	})
	s.AddSpawnWorker()
	filler, other := userClient(t, s, "filler"), userClient(t, s, "other")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prompt := protocol.Text("say " + strings.Repeat("x", promptSize-4))
	start := func(cl *client.Client, root *client.Root) error {
		r, err := cl.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: prompt})
		if err == nil {
			_, err = r.Result(ctx)
		}
		return err
	}
	root, err := openAs(ctx, t, filler)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := start(filler, root); err != nil {
			t.Fatalf("start %d within the user's prompt bytes: %v", i+1, err)
		}
	}
	err = start(filler, root)
	if protocol.CodeOf(err) != protocol.CodeLimitExceeded || !strings.Contains(err.Error(), "prompt bytes per user") {
		t.Fatalf("a start past the user's prompt bytes: %v, want LIMIT_EXCEEDED (prompt bytes per user)", err)
	}
	rows, err := filler.Children(ctx, protocol.ChildrenListRequest{Parent: root.SessionID, Authority: root.Authority()})
	if err != nil || len(rows.Rows) != 2 {
		t.Fatalf("the user's children after the refused start: %d, %v; want the 2 accepted", len(rows.Rows), err)
	}
	otherRoot, err := openAs(ctx, t, other)
	if err != nil {
		t.Fatal(err)
	}
	if err := start(other, otherRoot); err != nil {
		t.Fatalf("another user's start: %v", err)
	}
	anon, err := openAs(ctx, t, s.Client)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := start(s.Client, anon); err != nil {
			t.Fatalf("an anonymous start: %v", err)
		}
	}
}
