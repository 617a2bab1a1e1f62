package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestAForeignNoticeIsDropped is issue 17's notice forgery: a notice that
// reaches a run's notify subject but names another run is not its result.
// The run takes only its own (the real one after a forged one), and with
// only forged ones it falls back to runs.await.
func TestAForeignNoticeIsDropped(t *testing.T) {
	url := coreServer(t)
	subj := protocol.MustSubjects("")
	real := protocol.SubagentResult{StopReason: protocol.StopCompleted, Output: protocol.Text("real")}
	forged := protocol.SubagentResult{StopReason: protocol.StopCompleted, Output: protocol.Text("forged")}
	settled := protocol.RunStatus{RunID: "r1", ChildID: "c1", State: protocol.RunSettled, Result: &real}
	for _, realNotice := range []bool{true, false} {
		name := map[bool]string{true: "real notice after", false: "await"}[realNotice]
		t.Run(name, func(t *testing.T) {
			f := newFakeCoordinator(t, url, subj, settled)
			cl, err := client.New(dial(t, url), client.Options{AwaitFallback: 300 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			run, err := cl.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Prompt: protocol.Text("x")})
			if err != nil {
				t.Fatal(err)
			}
			subject := <-f.notify
			attacker := dial(t, url)
			for _, id := range []string{"r2", "", "R1"} {
				n := protocol.RunNotice{RunID: id, ChildID: "c1", Result: forged}
				if err := attacker.Publish(subject, body(t, protocol.Msgpack, n)); err != nil {
					t.Fatal(err)
				}
			}
			if realNotice {
				if err := attacker.Publish(subject, body(t, protocol.Msgpack, protocol.RunNotice{RunID: "r1", ChildID: "c1", Result: real})); err != nil {
					t.Fatal(err)
				}
			}
			got, err := run.Result(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if protocol.PlainText(got.Output) != "real" {
				t.Fatalf("result %q, want the run's own", protocol.PlainText(got.Output))
			}
			if awaited := f.awaited.Load(); (awaited > 0) == realNotice {
				t.Errorf("runs.await called %d times with a real notice %v", awaited, realNotice)
			}
		})
	}
}

// TestAUserCallsOnItsOwnSubjects: a client with a NATS user calls the
// coordinator on <p>.v1.user.<user>.<endpoint> (the user taken from the
// connection, or given), so the coordinator knows who calls.
func TestAUserCallsOnItsOwnSubjects(t *testing.T) {
	url := coreServer(t, &server.User{Username: "alice", Password: "pw"}, &server.User{Username: "svc", Password: "pw"})
	subj := protocol.MustSubjects("")
	got := make(chan string, 4)
	svc := dial(t, url, nats.UserInfo("svc", "pw"))
	if _, err := svc.Subscribe(subj.UserGroup()+".>", func(m *nats.Msg) {
		got <- m.Subject
		_ = m.Respond(body(t, protocol.Msgpack, protocol.ProvidersListReply{}))
	}); err != nil {
		t.Fatal(err)
	}
	if err := svc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, tc := range []struct {
		opts client.Options
		want string
	}{
		{client.Options{}, "brood.v1.user.alice.providers.list"},
		{client.Options{User: "bob"}, "brood.v1.user.bob.providers.list"},
	} {
		cl, err := client.New(dial(t, url, nats.UserInfo("alice", "pw")), tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Providers(ctx); err != nil {
			t.Fatal(err)
		}
		if subject := <-got; subject != tc.want {
			t.Errorf("called %s, want %s", subject, tc.want)
		}
		cl.Close()
	}
	if _, err := client.New(dial(t, url, nats.UserInfo("alice", "pw")), client.Options{User: "not.a.token"}); !errors.Is(err, protocol.ErrInvalidArgument) {
		t.Errorf("a user that is no subject token: %v", err)
	}
}

// TestARefusedCallFailsAtOnce is issue 17, point 8: a request NATS refuses
// the connection's user (a permissions violation, reported asynchronously)
// ends at once with PERMISSION_DENIED naming the subject, instead of
// waiting out its timeout to end UNAVAILABLE; so does a call whose replies
// the user may not receive.
func TestARefusedCallFailsAtOnce(t *testing.T) {
	subj := protocol.MustSubjects("")
	url := coreServer(t, []*server.User{
		{Username: "client", Password: "pw", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"brood.v1.user.client.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.client.>"}},
		}},
		{Username: "svc", Password: "pw"},
	}...)
	svc := dial(t, url, nats.UserInfo("svc", "pw"))
	for _, subject := range []string{subj.Coord(protocol.EpAuthorityUser), subj.User("client", ">")} {
		if _, err := svc.Subscribe(subject, func(m *nats.Msg) { _ = m.Respond([]byte{0x80}) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := svc.Flush(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name, prefix, subject string
		call                  func(*client.Client) error
	}{
		{"publish refused", "_INBOX.client", subj.Coord(protocol.EpAuthorityUser), func(cl *client.Client) error {
			_, err := cl.GlobalGrant(ctx)
			return err
		}},
		{"replies refused", "_INBOX.elsewhere", "_INBOX.elsewhere.", func(cl *client.Client) error {
			_, err := cl.Providers(ctx)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc := dial(t, url, nats.UserInfo("client", "pw"), nats.CustomInboxPrefix(tc.prefix))
			cl, err := client.New(nc, client.Options{Timeout: 15 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			began := time.Now()
			err = tc.call(cl)
			if !errors.Is(err, protocol.ErrPermissionDenied) || !strings.Contains(err.Error(), tc.subject) {
				t.Fatalf("call = %v, want PERMISSION_DENIED naming %s", err, tc.subject)
			}
			if took := time.Since(began); took > 5*time.Second {
				t.Fatalf("the refusal took %s, not at once", took)
			}
		})
	}
}
