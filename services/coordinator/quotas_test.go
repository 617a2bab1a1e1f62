package coordinator_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// userClient calls the coordinator as NATS user (on its own subjects
// brood.v1.user.<user>.<endpoint>; the test server has no permissions).
func userClient(t *testing.T, s *stack.Stack, user string) *client.Client {
	t.Helper()
	cl, err := client.New(s.NC, client.Options{User: user})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func openAs(ctx context.Context, t *testing.T, cl *client.Client) (*client.Root, error) {
	t.Helper()
	root, err := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir()})
	if err == nil {
		t.Cleanup(func() { _ = root.Close(context.Background()) })
	}
	return root, err
}

// TestUserOpenRootsAreBounded: one user holds at most UserOpenRootsMax open
// roots, also when its opens come at once; closing one makes room; other
// users and anonymous callers are not counted against it (issue 17: 3,000
// agents.open never closed were all accepted).
func TestUserOpenRootsAreBounded(t *testing.T) {
	const limit, burst = 3, 12
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.UserOpenRootsMax = limit })
	alice, bob := userClient(t, s, "alice"), userClient(t, s, "bob")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	opened, refused := openBurst(ctx, t, alice, burst)
	if len(opened) != limit || refused != burst-limit {
		t.Fatalf("%d opens of one user at once: %d opened, %d refused; want %d and %d", burst, len(opened), refused, limit, burst-limit)
	}
	if _, err := openAs(ctx, t, bob); err != nil {
		t.Fatalf("another user's open: %v", err)
	}
	if _, err := openAs(ctx, t, s.Client); err != nil {
		t.Fatalf("an anonymous open: %v", err)
	}
	if err := opened[0].Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := openAs(ctx, t, alice); err != nil {
		t.Fatalf("an open after closing one of the user's roots: %v", err)
	}
}

// openBurst sends n agents.open of cl at once and returns the roots opened
// and how many were refused for the open-roots quota; any other outcome
// fails the test.
func openBurst(ctx context.Context, t *testing.T, cl *client.Client, n int) (opened []*client.Root, refused int) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			root, err := openAs(ctx, t, cl)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				opened = append(opened, root)
			case protocol.CodeOf(err) == protocol.CodeLimitExceeded && strings.Contains(err.Error(), "open roots per user"):
				refused++
			default:
				t.Errorf("open: %v", err)
			}
		}()
	}
	wg.Wait()
	return opened, refused
}

// TestUserOpenRootsHoldAcrossReplicas: with two coordinator replicas serving
// one user's simultaneous opens, the user still holds exactly
// UserOpenRootsMax roots (issue 17: each replica counted only the leases it
// had seen, so R replicas admitted up to R-1 roots past the quota, more
// while their watches lagged); a root closed through either replica makes
// room at once on both, and only for one more.
func TestUserOpenRootsHoldAcrossReplicas(t *testing.T) {
	const limit, burst = 3, 16
	s := stack.New(t)
	for range 2 {
		s.AddCoordinator(func(c *coordinator.Config) { c.UserOpenRootsMax = limit })
	}
	alice := userClient(t, s, "alice")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opened, refused := openBurst(ctx, t, alice, burst)
	if len(opened) != limit || refused != burst-limit {
		t.Fatalf("%d opens of one user at once over 2 replicas: %d opened, %d refused; want %d and %d", burst, len(opened), refused, limit, burst-limit)
	}
	for round := range 3 {
		if err := opened[round].Close(ctx); err != nil {
			t.Fatal(err)
		}
		again, refused := openBurst(ctx, t, alice, burst)
		if len(again) != 1 || refused != burst-1 {
			t.Fatalf("round %d: %d opens at once after one close: %d opened, %d refused; want 1 and %d", round, burst, len(again), refused, burst-1)
		}
	}
}

// TestUserRequestRateIsBounded: a user's requests beyond its token bucket
// are LIMIT_EXCEEDED; another user and anonymous callers are unaffected.
func TestUserRequestRateIsBounded(t *testing.T) {
	const burst = 5
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.UserRequestsPerSecond, c.UserRequestsBurst = 0.01, burst })
	alice, bob := userClient(t, s, "alice"), userClient(t, s, "bob")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < burst; i++ {
		if _, err := alice.Providers(ctx); err != nil {
			t.Fatalf("request %d of %d: %v", i+1, burst, err)
		}
	}
	if _, err := alice.Providers(ctx); protocol.CodeOf(err) != protocol.CodeLimitExceeded || !strings.Contains(err.Error(), "requests per user") {
		t.Fatalf("a request over the user's rate: %v, want LIMIT_EXCEEDED", err)
	}
	if _, err := bob.Providers(ctx); err != nil {
		t.Fatalf("another user's request: %v", err)
	}
	for i := 0; i <= burst; i++ {
		if _, err := s.Client.Providers(ctx); err != nil {
			t.Fatalf("anonymous request %d: %v", i+1, err)
		}
	}
}

// TestExpiredGrantsAreRemoved: a grant's record carries its own TTL, so the
// server removes it once it expired (issue 17: grant records were never
// deleted), and the grant is refused from then on.
func TestExpiredGrantsAreRemoved(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.GrantTTL = time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := s.Client.UserGrant(ctx)
	if err != nil {
		t.Fatal(err)
	}
	key := store.GrantKey(protocol.HashCredential(g.Grant))
	if _, err := s.Store.Agents.Get(ctx, key); err != nil {
		t.Fatalf("the grant's record: %v", err)
	}
	testutil.Eventually(t, 15*time.Second, func() bool {
		_, err := s.Store.Agents.Get(ctx, key)
		return errors.Is(err, jetstream.ErrKeyNotFound)
	}, "the expired grant's record removed")
	if _, err := s.Client.Children(ctx, protocol.ChildrenListRequest{Authority: protocol.Authority{Grant: g.Grant}}); protocol.CodeOf(err) != protocol.CodeUnauthorized {
		t.Fatalf("an expired grant: %v, want UNAUTHORIZED", err)
	}
}

// TestALeaseUnderAProvidersKeyIsNotTheRoots: a worker may write its own
// provider's children's leases (lease.<provider>.<sessionId>) but not
// roots' (root.<sessionId>, which only coordinators write;
// docs/security.md). A lease it writes under its provider's key for a
// root's id, or under the root's bare id, with a credential of its own and
// a live host, does not pass for the root, to start a run or to read the
// root: a session's scope comes from its header, and a root's lease only
// from its root key. The root's own credential keeps working.
func TestALeaseUnderAProvidersKeyIsNotTheRoots(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	w, _ := s.AddSpawnWorker()
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cred := protocol.NewCredential()
	for _, key := range []string{store.LeaseKey("spawn", root.SessionID), root.SessionID} {
		for _, kind := range []string{protocol.AgentContinuable, protocol.AgentRoot} {
			forged := protocol.AgentRecord{SessionID: root.SessionID, Kind: kind, HostID: w.ID(), Epoch: 1, Provider: "spawn",
				CredentialHash: protocol.HashCredential(cred), ExpiresAt: store.NowMs() + 3600_000, CreatedAt: store.NowMs()}
			if _, err := store.Put(ctx, s.Store.Agents, key, forged); err != nil {
				t.Fatal(err)
			}
			forgedRef := protocol.ParentRef{SessionID: root.SessionID, Credential: cred}
			testutil.Consistently(t, time.Second, func() bool {
				_, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: forgedRef, Provider: "spawn", Prompt: protocol.Text("say forged")})
				return protocol.CodeOf(err) == protocol.CodeUnauthorized
			}, "a runs.start as the root with the credential of a lease of kind %s under %s is refused UNAUTHORIZED", kind, key)
			// A read decides on that credential alone (no later check of the
			// lease from the bucket's leader, as a start has).
			testutil.Consistently(t, time.Second, func() bool {
				_, err := s.Client.Header(ctx, protocol.SessionGetRequest{SessionID: root.SessionID, Authority: protocol.Authority{Parent: &forgedRef}})
				return protocol.CodeOf(err) == protocol.CodeUnauthorized
			}, "a sessions.get of the root with the credential of a lease of kind %s under %s is refused UNAUTHORIZED", kind, key)
		}
	}
	run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("say ok")})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := run.Result(ctx); err != nil || protocol.PlainText(res.Output) != "ok" {
		t.Fatalf("the root's own run: %+v, %v", res, err)
	}
}
