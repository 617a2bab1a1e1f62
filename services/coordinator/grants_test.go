package coordinator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// TestUserGrantsLiveTheirTTLAndCanBeDisabled: authority.user mints a grant
// that lives 24 hours by default (docs/protocol.md §5.15) or the configured
// GrantTTL; a grant is honoured until it expires and refused as UNAUTHORIZED
// after, as is an unknown one; a coordinator with user grants disabled
// mints none and honours none minted earlier (UNAUTHORIZED).
func TestUserGrantsLiveTheirTTLAndCanBeDisabled(t *testing.T) {
	ctx := context.Background()
	t.Run("default lifetime", func(t *testing.T) {
		s := stack.New(t)
		s.AddCoordinator()
		before := store.NowMs()
		g, err := s.Client.UserGrant(ctx)
		if err != nil {
			t.Fatal(err)
		}
		day := (24 * time.Hour).Milliseconds()
		if g.Grant == "" || g.ExpiresAt < before+day || g.ExpiresAt > store.NowMs()+day {
			t.Fatalf("grant expires at %d, want 24 h after it was minted (%d)", g.ExpiresAt, before+day)
		}
	})
	t.Run("expiry", func(t *testing.T) {
		s := stack.New(t)
		const ttl = 2 * time.Second
		s.AddCoordinator(func(c *coordinator.Config) { c.GrantTTL = ttl })
		root := s.Root()
		g, err := s.Client.UserGrant(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if left := time.Until(time.UnixMilli(g.ExpiresAt)); left <= 0 || left > ttl {
			t.Fatalf("grant expires in %s, want within the configured %s", left, ttl)
		}
		read := func(grant string) error {
			_, err := s.Client.Log(ctx, protocol.LogReadRequest{SessionID: root.SessionID, Authority: protocol.Authority{Grant: grant}})
			return err
		}
		if err := read(g.Grant); err != nil {
			t.Fatalf("a live grant was refused: %v", err)
		}
		if err := read(protocol.NewCredential()); protocol.CodeOf(err) != protocol.CodeUnauthorized {
			t.Fatalf("an unknown grant: %v, want UNAUTHORIZED", err)
		}
		testutil.Eventually(t, 30*time.Second, func() bool { return store.NowMs() > g.ExpiresAt }, "the grant's expiry passes")
		if err := read(g.Grant); protocol.CodeOf(err) != protocol.CodeUnauthorized || !strings.Contains(err.Error(), "expired") {
			t.Fatalf("an expired grant: %v, want UNAUTHORIZED (expired)", err)
		}
	})
	t.Run("disabled", func(t *testing.T) {
		s := stack.New(t)
		s.AddCoordinator(func(c *coordinator.Config) { c.UserGrantsDisabled = true })
		if g, err := s.Client.UserGrant(ctx); protocol.CodeOf(err) != protocol.CodeUnauthorized {
			t.Fatalf("authority.user with grants disabled: %+v, %v; want UNAUTHORIZED", g, err)
		}
		// A grant minted while grants were on (by this deployment before a
		// restart with them off, or by another coordinator) acts no more.
		root := s.Root()
		earlier := protocol.NewCredential()
		if _, err := store.Create(ctx, s.Store.Agents, store.GrantKey(protocol.HashCredential(earlier)),
			protocol.UserGrantRecord{ExpiresAt: store.NowMs() + time.Hour.Milliseconds(), MintedBy: "earlier"}); err != nil {
			t.Fatal(err)
		}
		_, err := s.Client.Log(ctx, protocol.LogReadRequest{SessionID: root.SessionID, Authority: protocol.Authority{Grant: earlier}})
		if protocol.CodeOf(err) != protocol.CodeUnauthorized || !strings.Contains(err.Error(), "no user grants") {
			t.Fatalf("a grant minted earlier, with grants disabled: %v; want UNAUTHORIZED (grants disabled)", err)
		}
		// The root's own credential still acts.
		if _, err := s.Client.Log(ctx, protocol.LogReadRequest{SessionID: root.SessionID, Authority: root.Authority()}); err != nil {
			t.Fatalf("the root's credential with grants disabled: %v", err)
		}
	})
}
