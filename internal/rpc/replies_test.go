package rpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// A coordinator's requests to a worker host carry a reply subject of the
// host's scope, _INBOX.coordinator.host.<scope>.<id>.<token>, which a
// worker user may publish without allow_responses (an answer it sends
// after a reconnect): the deployment gives worker-<p> only its own scope's
// (deploy/nats/cluster/accounts.conf). Here the worker has no
// allow_responses at all, so each answer is a plain publish its
// permissions must allow, and an answer aimed at another scope's request is
// refused by the server and never reaches the caller.
func TestHostAnswersTravelOnTheirScopesReplySubjects(t *testing.T) {
	srv := testutil.ServerWithUsers(t, []*server.User{
		{Username: "coordinator", Password: "pc", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"brood.v1.host.>", "brood.v1.provider.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.coordinator.>"}},
		}},
		{Username: "worker-spawn", Password: "pw", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"_INBOX.coordinator.host.spawn.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"brood.v1.host.>"}},
		}},
	})
	connect := func(user, pass string) *nats.Conn {
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, pass), nats.CustomInboxPrefix("_INBOX."+user))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	coord, worker := connect("coordinator", "pc"), connect("worker-spawn", "pw")
	replies, err := rpc.NewReplies(coord)
	if err != nil {
		t.Fatal(err)
	}
	defer replies.Close()
	seen := make(chan string, 4)
	sub, err := worker.Subscribe("brood.v1.host.>", func(m *nats.Msg) {
		seen <- m.Reply
		data, _ := protocol.Marshal(protocol.Msgpack, echo{Text: "from " + m.Subject})
		_ = worker.Publish(m.Reply, data) // a plain publish, as after a reconnect
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := worker.Flush(); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name, scope, subject string
		answered             bool
	}{
		{"its own scope's request", "spawn", "brood.v1.host.spawn.H1.state", true},
		{"another scope's request", "fork", "brood.v1.host.fork.H1.state", false},
		{"a host id without a scope", "", "brood.v1.host.H1.state", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var got echo
			err := replies.Call(ctx, tt.scope, tt.subject, echo{Text: "q"}, &got)
			reply := <-seen
			scope := tt.scope
			if scope == "" {
				scope = "_"
			}
			if want := "_INBOX.coordinator." + rpc.HostRepliesToken + "." + scope + "."; !strings.HasPrefix(reply, want) {
				t.Errorf("reply subject %q, want it under %s", reply, want)
			}
			if tt.answered {
				if err != nil || got.Text != "from "+tt.subject {
					t.Fatalf("answer %+v, %v", got, err)
				}
				return
			}
			if !errors.Is(err, context.DeadlineExceeded) || got.Text != "" {
				t.Fatalf("an answer the worker may not send arrived: %+v, %v", got, err)
			}
		})
	}
	t.Run("nobody serves the subject", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := replies.Call(ctx, "spawn", "brood.v1.provider.spawn.H1.start", echo{}, nil)
		if !errors.Is(err, nats.ErrNoResponders) || !errors.Is(err, protocol.ErrUnavailable) {
			t.Fatalf("got %v, want UNAVAILABLE with cause nats.ErrNoResponders", err)
		}
	})
}
