package rpc_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestRepliesGoOnlyWhereRepliesMayGo: a server answers only reply subjects
// under its policy's inboxes, and on a subject that names its caller only
// under that user's own inbox prefix; any other request is refused before
// its handler runs (nothing done, no answer published anywhere) and counted
// (issue 29, item 1: the coordinator wrote a grant record as the answer to
// an agents.open whose reply subject was $KV.brood_agents.grant.<hash>).
// Endpoints, plain subjects (a host's) and the micro verbs all check.
func TestRepliesGoOnlyWhereRepliesMayGo(t *testing.T) {
	tests := []struct {
		name, subject, reply string
		refused              string // the reason; "" when answered
	}{
		{"an endpoint answers its caller's own inbox", "svc.user.alice.work", "_INBOX.alice.abc.1", ""},
		{"an endpoint refuses a KV subject", "svc.user.alice.work", "$KV.brood_agents.grant.abc", rpc.ReplyOutsideUserInbox},
		{"an endpoint refuses another user's inbox", "svc.user.alice.work", "_INBOX.bob.abc.1", rpc.ReplyOutsideUserInbox},
		{"an endpoint refuses the inbox root on a user's subject", "svc.user.alice.work", "_INBOX.abc", rpc.ReplyOutsideUserInbox},
		{"an endpoint refuses a prefix that only starts like the user's", "svc.user.alice.work", "_INBOX.alicex.abc", rpc.ReplyOutsideUserInbox},
		{"an anonymous endpoint answers any inbox", "svc.anon.work", "_INBOX.abc.1", ""},
		{"an anonymous endpoint refuses a KV subject", "svc.anon.work", "$KV.brood_agents.grant.abc", rpc.ReplyOutsideInboxes},
		{"an anonymous endpoint refuses a stream subject", "svc.anon.work", "brood.v1.session.X", rpc.ReplyOutsideInboxes},
		{"an anonymous endpoint refuses a JetStream API subject", "svc.anon.work", "$JS.API.STREAM.PURGE.X", rpc.ReplyOutsideInboxes},
		{"a plain subject answers an inbox", "host.work", "_INBOX.abc.1", ""},
		{"a plain subject refuses a KV subject", "host.work", "$KV.brood_runs.state.spawn.R", rpc.ReplyOutsideInboxes},
		{"a micro verb refuses a KV subject", "$SRV.PING", "$KV.brood_hosts.x", rpc.ReplyOutsideInboxes},
		{"a micro verb answers an inbox", "$SRV.PING", "_INBOX.abc.1", ""},
	}
	srvNATS := testutil.Server(t)
	nc := testutil.Connect(t, srvNATS.ClientURL())
	snc := testutil.Connect(t, srvNATS.ClientURL())
	var mu sync.Mutex
	refused := map[string]string{} // subject+reply -> reason
	var handled atomic.Int64
	srv := rpc.NewServer(snc, 4, slog.Default()).WithReplyPolicy(rpc.ReplyPolicy{
		UserOf: func(subject string) string {
			user, _, _ := strings.Cut(strings.TrimPrefix(subject, "svc.user."), ".")
			if !strings.HasPrefix(subject, "svc.user.") {
				return ""
			}
			return user
		},
		Refused: func(subject, reason string) {
			mu.Lock()
			refused[subject] = reason
			mu.Unlock()
		},
	})
	t.Cleanup(func() { srv.Stop(context.Background()) })
	h := func(context.Context, rpc.Request) (any, error) { handled.Add(1); return echo{"ok"}, nil }
	svc, err := srv.AddService(rpc.ServiceConfig{Name: "svc", Version: "1.0.0", QueueGroup: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.AddEndpointOn("work", []string{"svc.user.*.work", "svc.anon.work"}, h); err != nil {
		t.Fatal(err)
	}
	if err := srv.Handle("host.work", h); err != nil {
		t.Fatal(err)
	}
	if err := snc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sub, err := nc.SubscribeSync(tc.reply)
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			before := handled.Load()
			mu.Lock()
			delete(refused, tc.subject)
			mu.Unlock()
			data, _ := protocol.Marshal(protocol.Msgpack, echo{"x"})
			if err := nc.PublishMsg(&nats.Msg{Subject: tc.subject, Reply: tc.reply, Data: data}); err != nil {
				t.Fatal(err)
			}
			if tc.refused == "" {
				if _, err := sub.NextMsg(5 * time.Second); err != nil {
					t.Fatalf("no answer on %s: %v", tc.reply, err)
				}
				return
			}
			testutil.Eventually(t, 5*time.Second, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return refused[tc.subject] != ""
			}, "the request to %s refused", tc.subject)
			mu.Lock()
			got := refused[tc.subject]
			mu.Unlock()
			if got != tc.refused {
				t.Errorf("refused as %q, want %q", got, tc.refused)
			}
			// The refusal is decided before the handler would run and
			// before any answer: nothing was published for the request.
			if n, _, _ := sub.Pending(); n != 0 {
				t.Fatalf("answered on %s", tc.reply)
			}
			if n := handled.Load() - before; n != 0 && !strings.HasPrefix(tc.subject, "$SRV") {
				t.Fatalf("the handler ran %d times for a refused request", n)
			}
		})
	}
}
