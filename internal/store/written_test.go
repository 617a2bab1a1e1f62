package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestARecordItsWriterDidNotWriteIsNone: a value under a grant, drain or
// closed-root key that lacks a field its writer (a coordinator) always sets
// is no record: every read answers ErrNotFound (Get, GetLatest, the grant
// read) or an error (Decode, what the watches use). The value stored is an
// AgentsOpenReply, what the confused deputy of issue 29, item 1 wrote under
// a grant key (its expiresAt would otherwise pass for a grant's over every
// session).
func TestARecordItsWriterDidNotWriteIsNone(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	forged := protocol.AgentsOpenReply{SessionID: "S", Credential: "c", LeaseMs: 30_000, ExpiresAt: store.NowMs() + 30_000}
	whole := map[string]any{
		store.GrantKey("forged"): protocol.UserGrantRecord{ExpiresAt: store.NowMs() + 30_000, MintedBy: "coord"},
		store.DrainKey("S"):      protocol.DrainRecord{Root: "S", CreatedAt: store.NowMs()},
		store.ClosedRootKey("S"): protocol.ClosedRootRecord{ClosedAt: store.NowMs()},
	}
	tests := []struct {
		name string
		key  string
		read func(key string) error
	}{
		{"a grant", store.GrantKey("forged"), func(key string) error {
			_, err := st.Grant(ctx, "forged")
			return err
		}},
		{"a grant from the leader", store.GrantKey("forged"), func(key string) error {
			_, err := store.GetLatest[protocol.UserGrantRecord](ctx, st.Agents, key)
			return err
		}},
		{"a drain marker", store.DrainKey("S"), func(key string) error {
			_, err := store.Get[protocol.DrainRecord](ctx, st.Agents, key)
			return err
		}},
		{"a closed-root marker", store.ClosedRootKey("S"), func(key string) error {
			_, err := store.Get[protocol.ClosedRootRecord](ctx, st.Agents, key)
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := store.Put(ctx, st.Agents, tc.key, forged); err != nil {
				t.Fatal(err)
			}
			if err := tc.read(tc.key); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("the forged record read: %v, want ErrNotFound", err)
			}
			e, err := st.Agents.Get(ctx, tc.key)
			if err != nil {
				t.Fatal(err)
			}
			var decodeErr error
			switch tc.key {
			case store.GrantKey("forged"):
				_, decodeErr = store.Decode[protocol.UserGrantRecord](e)
			case store.DrainKey("S"):
				_, decodeErr = store.Decode[protocol.DrainRecord](e)
			default:
				_, decodeErr = store.Decode[protocol.ClosedRootRecord](e)
			}
			if decodeErr == nil {
				t.Fatal("Decode took the forged record")
			}
			// What its writer writes is read.
			if _, err := store.Put(ctx, st.Agents, tc.key, whole[tc.key]); err != nil {
				t.Fatal(err)
			}
			if err := tc.read(tc.key); err != nil {
				t.Fatalf("the writer's record: %v", err)
			}
		})
	}
}
