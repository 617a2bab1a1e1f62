package deploy

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2aclient/agentcard"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	a2agateway "github.com/brood-dev/brood/services/a2a-gateway"
	"github.com/brood-dev/brood/services/coordinator"
	spawnworker "github.com/brood-dev/brood/services/spawn-worker"
)

// TestForgeryThroughTheA2AGateway (issue 34, item 2): the 3-node cluster of
// nats/cluster runs the coordinator and a spawn worker as their users and
// the A2A gateway as its own role (user a2a-gateway, the cards only), its
// callers acting as client-role users: the victim's token maps to
// trusted-host (a user whose own subjects a client may not publish on), the
// attacker's to client. Through the gateway the attacker tries the victim's
// task id, forged and guessed context and task ids, and oversized messages:
// each is refused as TASK_NOT_FOUND (the same answer as for an id that
// names nothing) or as bad input, nothing is started or changed (the
// victim's log and the session count read back identical), and no
// connection of the gateway ever makes a request NATS refuses.
func TestForgeryThroughTheA2AGateway(t *testing.T) {
	setPasswords(t)
	servers := startServers(t, clusterOptions(t)...)
	waitMetaLeader(t, servers)
	var urls []string
	for _, s := range servers {
		urls = append(urls, s.ClientURL())
	}
	all := strings.Join(urls, ",")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	subj := protocol.MustSubjects("")
	cfg := store.DefaultConfig()
	cfg.Replicas = 3
	admin := connectAs(t, all, "admin", nil)
	if _, err := store.Provision(ctx, admin, subj, cfg); err != nil {
		t.Fatalf("provision as admin: %v", err)
	}
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	open := func(nc *nats.Conn) *store.Store {
		st, err := store.Open(ctx, nc, subj, openConfig(nc, cfg))
		if err != nil {
			t.Fatalf("open as %s: %v", nc.Opts.User, err)
		}
		return st
	}
	v := &violations{}
	coordNC := connectAs(t, urls[0], "coordinator", v)
	coord, err := coordinator.New(coordinator.Config{NC: coordNC, Store: open(coordNC), HeartbeatInterval: stack.Heartbeat, HostExpiry: stack.HostExpiry, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Background(t, coord)
	<-coord.Ready()
	workerNC := connectAs(t, urls[1], "worker-spawn", v)
	w, err := spawnworker.New(spawnworker.Config{
		NC: workerNC, Store: open(workerNC), Models: func() (model.Model, error) { return model.NewScripted(), nil },
		HeartbeatInterval: stack.Heartbeat, HostExpiry: stack.HostExpiry, DrainGrace: 2 * time.Second, Logger: testutil.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Background(t, w)

	// The gateway: its own user for the cards, the callers' users for the rest.
	gwv := &violations{}
	cardsNC := connectAs(t, urls[2], "a2a-gateway", gwv)
	cards, err := client.New(cardsNC, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cards.Close)
	const victimToken, attackerToken = "victim-token-0123456789", "attacker-token-0123456789"
	gw, err := a2agateway.New(a2agateway.Config{
		Listen: "127.0.0.1:0", Cards: cards, Logger: testutil.Logger(t), Workspace: t.TempDir(),
		Callers: []a2agateway.Caller{
			{User: "trusted-host", TokenSHA256: a2agateway.TokenHash(victimToken), NATSPassword: passwordOf(t, "trusted-host")},
			{User: "client", TokenSHA256: a2agateway.TokenHash(attackerToken), NATSPassword: passwordOf(t, "client")},
		},
		Dial: func(user, password string) (*nats.Conn, error) {
			return nats.Connect(all, nats.UserInfo(user, password), nats.CustomInboxPrefix(protocol.UserInboxPrefix(user)),
				nats.MaxReconnects(-1), nats.ErrorHandler(gwv.handler))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Background(t, gw)
	<-gw.Ready()

	var card *a2a.AgentCard
	waitFor(t, 30*time.Second, "the spawn provider's card", func() bool {
		card, err = agentcard.NewResolver(http.DefaultClient).Resolve(ctx, gw.AgentURL("spawn"))
		return err == nil
	})
	as := func(token string) *a2aclient.Client {
		hc := &http.Client{Transport: bearerRT{token: token}}
		cl, err := a2aclient.NewFromCard(ctx, card, a2aclient.WithJSONRPCTransport(hc), a2aclient.WithRESTTransport(hc))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Destroy() })
		return cl
	}
	victim, attacker := as(victimToken), as(attackerToken)

	msg := func(contextID, text string) *a2a.SendMessageRequest {
		m := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text))
		m.ContextID = contextID
		return &a2a.SendMessageRequest{Message: m}
	}
	res, err := victim.SendMessage(ctx, msg("", "say secret"))
	if err != nil {
		t.Fatalf("the victim's send: %v", err)
	}
	task, ok := res.(*a2a.Task)
	if !ok || task.Status.State != a2a.TaskStateCompleted {
		t.Fatalf("the victim's task: %#v", res)
	}
	// What must not change: the victim's log, and the sessions that exist.
	logLen := func() int {
		r, err := victim.GetTask(ctx, &a2a.GetTaskRequest{ID: task.ID})
		if err != nil || r.Status.State != a2a.TaskStateCompleted {
			t.Fatalf("the victim's task read back: %v %+v", err, r)
		}
		s, err := js.Stream(ctx, "BROOD_LOG_spawn")
		if err != nil {
			t.Fatal(err)
		}
		return int(s.CachedInfo().State.Msgs)
	}
	sessions := func() uint64 {
		s, err := js.Stream(ctx, "BROOD_SESSIONS")
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().State.Msgs
	}
	logBefore, sessionsBefore := logLen(), sessions()

	ids := []a2a.TaskID{
		task.ID, // the victim's own task id
		a2a.TaskID(task.ContextID + ".01FORGEDMESSAGE0000000000"),
		a2a.TaskID("01FORGEDCONTEXT00000000000." + strings.TrimPrefix(string(task.ID), task.ContextID+".")),
		a2a.TaskID(task.ContextID), // no message part
		"../" + task.ID,
		a2a.TaskID(strings.Repeat("A", 65) + ".x"),
	}
	for _, id := range ids {
		if _, err := attacker.GetTask(ctx, &a2a.GetTaskRequest{ID: id}); !errors.Is(err, a2a.ErrTaskNotFound) {
			t.Errorf("get %q: %v, want TASK_NOT_FOUND", id, err)
		}
		if _, err := attacker.CancelTask(ctx, &a2a.CancelTaskRequest{ID: id}); !errors.Is(err, a2a.ErrTaskNotFound) {
			t.Errorf("cancel %q: %v, want TASK_NOT_FOUND", id, err)
		}
		for _, err := range attacker.SubscribeToTask(ctx, &a2a.SubscribeToTaskRequest{ID: id}) {
			if !errors.Is(err, a2a.ErrTaskNotFound) {
				t.Errorf("subscribe %q: %v, want TASK_NOT_FOUND", id, err)
			}
			break
		}
	}
	for _, c := range []string{task.ContextID, "01FORGEDCONTEXT00000000000", "../" + task.ContextID, strings.Repeat("B", 65)} {
		if _, err := attacker.SendMessage(ctx, msg(c, "say stolen")); !errors.Is(err, a2a.ErrTaskNotFound) {
			t.Errorf("followup in context %q: %v, want TASK_NOT_FOUND", c, err)
		}
		if _, err := attacker.ListTasks(ctx, &a2a.ListTasksRequest{ContextID: c}); !errors.Is(err, a2a.ErrTaskNotFound) {
			t.Errorf("list context %q: %v, want TASK_NOT_FOUND", c, err)
		}
	}
	if l, err := attacker.ListTasks(ctx, &a2a.ListTasksRequest{}); err != nil || len(l.Tasks) != 0 {
		t.Errorf("the attacker's list: %v, %d tasks, want none", err, len(l.Tasks))
	}
	// Oversized: a message over the coordinator's 256 KiB, and a body over
	// the gateway's RequestBytesMax.
	for _, n := range []int{300 << 10, a2agateway.RequestBytesMax + 1} {
		_, err := attacker.SendMessage(ctx, msg("", strings.Repeat("x", n)))
		if err == nil {
			t.Errorf("a %d-byte message was accepted", n)
		}
	}
	if got, want := logLen(), logBefore; got != want {
		t.Errorf("BROOD_LOG_spawn holds %d messages after the attempts, %d before", got, want)
	}
	if got := sessions(); got != sessionsBefore {
		t.Errorf("BROOD_SESSIONS holds %d messages after the attempts, %d before: a refused attempt started something", got, sessionsBefore)
	}
	if l := append(v.list(), gwv.list()...); len(l) > 0 {
		t.Errorf("permission violations: %v", l)
	}
}

type bearerRT struct{ token string }

func (b bearerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}
