package deploy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
	forkworker "github.com/brood-dev/brood/services/fork-worker"
	spawnworker "github.com/brood-dev/brood/services/spawn-worker"
)

// The forgery suite (issue 17): the 3-node cluster of nats/cluster, with
// its users and permissions, runs Brood's services as their own users; then
// each role in turn tries what docs/security.md says it cannot do, and each
// attempt must be refused with nothing changed: every stream's and bucket's
// configuration, consumers and messages (session headers and logs, inboxes,
// lifecycle events, leases, grants, run records) read back identical. The
// CLI verbs run as the users docs/security.md names for them.

// forgery is the deployment the attempts run against.
type forgery struct {
	t     *testing.T
	urls  []string
	all   string // every node's URL, comma-separated
	admin *nats.Conn
	js    jetstream.JetStream // the admin's: reads the state before and after
	// coordMetrics are the coordinator's (forgery_deputy_test.go reads
	// its refusals of reply subjects).
	coordMetrics *telemetry.Metrics
	// leaf, when set, makes run try each attempt through a site's leaf
	// node (leaf_test.go): it connects as the site's user of the role, and
	// answered counts what the hub answered it since; an attempt the hub
	// answered nothing at all also counts as refused (the hub drops what a
	// link may not carry without telling the site, whose server answers
	// "no responders" itself); that nothing changed is checked all the same.
	leaf func(t *testing.T, user string) (nc *nats.Conn, answered func() int)

	// The client's own root, idle child and user-scoped grant (what an
	// attacking client holds), and what the attacks aim at: a trusted
	// host's root with a settled run and an idle continuable child.
	victim struct {
		root            *client.Root
		child           string
		grant           string
		hostRoot        *client.Root
		hostRun         *client.Run
		hostChild       string
		clientCl, trust *client.Client
		// forkHost is the host id of the fork provider's worker (user
		// worker-fork), which the spawn provider's worker attacks, and
		// forkChild an idle continuable child of the client's root on fork.
		forkHost, forkChild string
		// forkRun a settled one-shot run of the client's root on fork.
		forkRun *client.Run
		// seedRun a settled fork run of a root of the trusted host whose
		// log holds a completed turn and then one in flight: its child's
		// header has a seed (seedLength seedLen), and the parent's log
		// holds events past it.
		seedRun  *client.Run
		seedRoot *client.Root
		seedLen  int64
		// coordInbox is an inbox subject of the coordinator's connection
		// (where its JetStream answers and KV watch deliveries arrive).
		coordInbox string
		// spawnPending is the sequence of a pending item of another spawn
		// session's inbox (in BROOD_INBOX_spawn, the stream of the spawn
		// worker's children's inboxes).
		spawnPending protocol.Seq
	}
}

func TestForgerySuite(t *testing.T) {
	setPasswords(t)
	servers := startServers(t, clusterOptions(t)...)
	waitMetaLeader(t, servers)
	f := &forgery{t: t}
	for _, s := range servers {
		f.urls = append(f.urls, s.ClientURL())
	}
	f.all = strings.Join(f.urls, ",")
	f.start()

	t.Run("the CLI as the client user", f.cliAsClient)
	t.Run("the CLI names the role a verb needs", f.cliNamesTheRole)
	t.Run("client", f.clientAttempts)
	t.Run("worker", f.workerAttempts)
	t.Run("worker of another provider", f.otherProviderAttempts)
	t.Run("worker events under its own provider", f.ownProviderEvents)
	t.Run("worker reads across providers", f.crossProviderReads)
	t.Run("worker of the fork provider", f.forkWorkerAttempts)
	t.Run("trusted host", f.trustedHostAttempts)
	t.Run("coordinator", f.coordinatorAttempts)
	t.Run("confused deputy", f.deputyAttempts)
	t.Run("worker of the same provider", f.sameProviderAttempts)
}

// start provisions as admin and runs a coordinator, a spawn worker and a
// fork worker as their users, then sets up the victims.
func (f *forgery) start() {
	t := f.t
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	subj := protocol.MustSubjects("")
	cfg := store.DefaultConfig()
	cfg.Replicas = 3
	f.admin = connectAs(t, f.all, "admin", nil)
	if _, err := store.Provision(ctx, f.admin, subj, cfg); err != nil {
		t.Fatalf("provision as admin: %v", err)
	}
	var err error
	if f.js, err = jetstream.New(f.admin); err != nil {
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
	coordNC := connectAs(t, f.urls[0], "coordinator", v)
	coordStore := open(coordNC)
	f.coordMetrics = telemetry.NewMetrics("test")
	coord, err := coordinator.New(coordinator.Config{
		NC: coordNC, Store: coordStore, HeartbeatInterval: stack.Heartbeat, HostExpiry: stack.HostExpiry, Metrics: f.coordMetrics,
		// Roots are not renewed while the attempts run, so nothing writes
		// but the attempts themselves: a root's client renews at a third
		// of the lease, and a lease of an hour puts the first renewal
		// past the package's 20-minute timeout (with 10 minutes, a suite
		// that took 242 s at load 25 saw its root renewed at 200 s,
		// counted as a change by an attempt).
		RootLease: time.Hour, Logger: testutil.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Background(t, coord)
	<-coord.Ready()
	f.victim.coordInbox = coordNC.NewInbox()
	workerNC := connectAs(t, f.urls[1], "worker-spawn", v)
	w, err := spawnworker.New(spawnworker.Config{
		NC: workerNC, Store: open(workerNC), Models: func() (model.Model, error) { return model.NewScripted(), nil },
		HeartbeatInterval: stack.Heartbeat, HostExpiry: stack.HostExpiry, DrainGrace: 2 * time.Second, Logger: testutil.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Background(t, w)
	forkNC := connectAs(t, f.urls[2], "worker-fork", v)
	fw, err := forkworker.New(forkworker.Config{
		NC: forkNC, Store: open(forkNC), Models: func() (model.Model, error) { return model.NewScripted(), nil },
		HeartbeatInterval: stack.Heartbeat, HostExpiry: stack.HostExpiry, DrainGrace: 2 * time.Second, Logger: testutil.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Background(t, fw)
	f.victim.forkHost = fw.ID()

	newClient := func(user string, node int) *client.Client {
		cl, err := client.New(connectAs(t, f.urls[node], user, v), client.Options{AwaitFallback: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	cl, trust := newClient("client", 2), newClient("trusted-host", 0)
	f.victim.clientCl, f.victim.trust = cl, trust
	waitFor(t, 20*time.Second, "spawn and fork listed", func() bool {
		r, err := cl.Providers(ctx)
		return err == nil && r.Instances[spawnworker.DefaultName] > 0 && r.Instances[forkworker.DefaultName] > 0
	})
	f.victim.root = openRoot(ctx, t, cl)
	f.victim.child = startIdleChild(ctx, t, cl, f.victim.root)
	g, err := cl.UserGrant(ctx)
	if err != nil || g.User != "client" {
		t.Fatalf("the client's grant: %+v, %v", g, err)
	}
	f.victim.grant = g.Grant
	f.victim.hostRoot = openRoot(ctx, t, trust)
	f.victim.hostRun, err = trust.StartRun(ctx, protocol.RunStartRequest{Parent: f.victim.hostRoot.Ref(), Provider: spawnworker.DefaultName, Prompt: protocol.Text("say secret result")})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := f.victim.hostRun.Result(ctx); err != nil || protocol.PlainText(res.Output) != "secret result" {
		t.Fatalf("the victim's run: %+v, %v", res, err)
	}
	f.victim.hostChild = startIdleChild(ctx, t, trust, f.victim.hostRoot)
	f.victim.forkChild = startIdleChildOn(ctx, t, cl, f.victim.root, forkworker.DefaultName)
	f.victim.forkRun, err = cl.StartRun(ctx, protocol.RunStartRequest{Parent: f.victim.root.Ref(), Provider: forkworker.DefaultName, Prompt: protocol.Text("say fork result")})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := f.victim.forkRun.Result(ctx); err != nil || protocol.PlainText(res.Output) != "fork result" {
		t.Fatalf("the victim's fork run: %+v, %v", res, err)
	}
	f.seedFork(ctx, v)
	// A pending item of a spawn session without a header (nothing serves
	// it, so it stays), written as a coordinator writes items.
	if _, f.victim.spawnPending, err = coordStore.Enqueue(ctx, spawnworker.DefaultName, "PENDINGVICTIM", store.InboxItem{Content: protocol.Text("a pending prompt")}, ""); err != nil {
		t.Fatal(err)
	}
	if vs := v.list(); len(vs) > 0 {
		t.Fatalf("permission violations while the services ran as their users:\n%s", strings.Join(vs, "\n"))
	}
}

// seedFork writes a completed turn and a turn in flight into the log of a
// new root of the trusted host (as the trusted host, which hosts roots'
// logs) and runs a fork child of it, whose seed the fork worker (as
// worker-fork, which reads no header and no root's log) reads through the
// coordinators.
func (f *forgery) seedFork(ctx context.Context, v *violations) {
	t := f.t
	f.victim.seedRoot = openRoot(ctx, t, f.victim.trust)
	logs, err := store.BindLogs(ctx, connectAs(t, f.urls[0], "trusted-host", v), protocol.MustSubjects(""))
	if err != nil {
		t.Fatal(err)
	}
	evs := testutil.TurnHistory(t, 1, true) // the turn in flight past the fork point
	if _, err := logs.NewLogWriter(protocol.ScopeRoot, f.victim.seedRoot.SessionID, 0, 0).Append(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	f.victim.seedLen = 6
	f.victim.seedRun, err = f.victim.trust.StartRun(ctx, protocol.RunStartRequest{Parent: f.victim.seedRoot.Ref(), Provider: forkworker.DefaultName, Prompt: protocol.Text("say seeded")})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := f.victim.seedRun.Result(ctx); err != nil || protocol.PlainText(res.Output) != "seeded" {
		t.Fatalf("the seeded fork run: %+v, %v", res, err)
	}
	g, err := f.victim.trust.UserGrant(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, err := f.victim.trust.Log(ctx, protocol.LogReadRequest{SessionID: f.victim.seedRun.ChildID, Authority: protocol.Authority{Grant: g.Grant}})
	if err != nil || l.Header.SeedLength != f.victim.seedLen || len(l.Events) <= int(f.victim.seedLen) || l.Events[f.victim.seedLen].Type != protocol.EvSessionEndSeed {
		t.Fatalf("the fork child's log: seed %d, %d events, %v; want its seed of %d events, then session/end-seed", l.Header.SeedLength, len(l.Events), err, f.victim.seedLen)
	}
}

func openRoot(ctx context.Context, t *testing.T, cl *client.Client) *client.Root {
	t.Helper()
	root, err := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = root.Close(context.Background()) })
	return root
}

// startIdleChild starts a continuable child and waits until its first turn
// ended and its activation settled (nothing runs afterwards).
func startIdleChild(ctx context.Context, t *testing.T, cl *client.Client, root *client.Root) string {
	t.Helper()
	return startIdleChildOn(ctx, t, cl, root, spawnworker.DefaultName)
}

// startIdleChildOn is startIdleChild on provider.
func startIdleChildOn(ctx context.Context, t *testing.T, cl *client.Client, root *client.Root, provider string) string {
	t.Helper()
	r, err := cl.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: provider, Parent: root.Ref(), Label: "idle", Prompt: protocol.Text("say idle")})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the child idle", func() bool {
		st, err := cl.State(ctx, protocol.ChildRef{ChildID: r.ChildID, Authority: root.Authority()})
		return err == nil && st.State == protocol.StateNone && st.Queued == 0
	})
	return r.ChildID
}

// snapshot is everything Brood stores but the host heartbeats: each
// stream's configuration, consumers and messages (subject, sequence and a
// digest of headers and data), read with the admin user.
func (f *forgery) snapshot() map[string][]string {
	t := f.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := map[string][]string{}
	for _, name := range []string{"BROOD_SESSIONS", "BROOD_LOG_root", "BROOD_LOG_spawn", "BROOD_LOG_fork", "BROOD_LOG_acp",
		"BROOD_INBOX_root", "BROOD_INBOX_spawn", "BROOD_INBOX_fork", "BROOD_INBOX_acp", "BROOD_EVENTS", "KV_brood_agents", "KV_brood_runs", "KV_brood_hosts"} {
		str, err := f.js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		info := str.CachedInfo()
		cfg, _ := json.Marshal(info.Config)
		out[name] = append(out[name], "config "+string(cfg), fmt.Sprintf("consumers %d", info.State.Consumers))
		if name == "KV_brood_hosts" {
			continue // heartbeats, every 100 ms
		}
		next := uint64(1)
		for {
			msgs, err := jetstreamext.GetBatch(ctx, f.js, name, 1000, jetstreamext.GetBatchSeq(next))
			if err != nil {
				t.Fatalf("read %s: %v", name, err)
			}
			got, more := 0, ""
			for m, err := range msgs {
				if errors.Is(err, jetstreamext.ErrNoMessages) {
					break
				}
				if err != nil {
					t.Fatalf("read %s: %v", name, err)
				}
				h := sha256.New()
				keys := slices.Sorted(maps.Keys(m.Header))
				for _, k := range keys {
					if k != "Nats-Num-Pending" && k != "Nats-Last-Sequence" && k != "Nats-UpTo-Sequence" {
						fmt.Fprintf(h, "%s=%v;", k, m.Header[k])
					}
				}
				h.Write(m.Data)
				out[name] = append(out[name], fmt.Sprintf("%d %s %s", m.Sequence, m.Subject, hex.EncodeToString(h.Sum(nil))[:16]))
				next, more, got = m.Sequence+1, m.Header.Get("Nats-Num-Pending"), got+1
			}
			if got == 0 || more == "0" {
				break
			}
		}
	}
	return out
}

// unchanged fails when the stored state differs from before.
func (f *forgery) unchanged(t *testing.T, what string, before map[string][]string) {
	t.Helper()
	after := f.snapshot()
	for name, b := range before {
		if a := after[name]; !slices.Equal(a, b) {
			t.Errorf("%s changed %s:\nbefore %v\nafter  %v", what, name, b, a)
		}
	}
}

// attempt is one thing a role must not be able to do: do tries it on a
// fresh connection of the role and returns how it was refused (nil when it
// was not).
type attempt struct {
	name string
	do   func(ctx context.Context, t *testing.T, nc *nats.Conn) error
}

// run tries each attempt as user and requires a refusal and no change.
func (f *forgery) run(t *testing.T, user string, attempts []attempt) {
	for _, a := range attempts {
		t.Run(a.name, func(t *testing.T) {
			before := f.snapshot()
			var nc *nats.Conn
			answered := func() int { return -1 }
			if f.leaf != nil {
				nc, answered = f.leaf(t, user)
			} else {
				nc = connectAs(t, f.urls[len(a.name)%len(f.urls)], user, nil)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := a.do(ctx, t, nc)
			if err == nil && answered() == 0 {
				err = errors.New("the hub answered nothing through the leaf")
			}
			if err == nil {
				t.Fatalf("%s: not refused", a.name)
			} else {
				t.Logf("refused: %v", err)
			}
			f.unchanged(t, a.name, before)
		})
	}
}

// refusedPublish publishes m and returns the permissions violation that
// names its subject (nil when the server accepted the publish).
func refusedPublish(nc *nats.Conn, m *nats.Msg) error {
	if err := nc.PublishMsg(m); err != nil {
		return err
	}
	return violationFor(nc, m.Subject)
}

// refusedSubscribe subscribes (in queue when set) and returns the
// permissions violation naming subject, nil when the subscription stands.
func refusedSubscribe(nc *nats.Conn, subject, queue string) error {
	var err error
	if queue == "" {
		_, err = nc.SubscribeSync(subject)
	} else {
		_, err = nc.QueueSubscribeSync(subject, queue)
	}
	if err != nil {
		return err
	}
	return violationFor(nc, subject)
}

func violationFor(nc *nats.Conn, subject string) error {
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	if err := nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), strconv.Quote(subject)) {
		return err
	}
	return nil
}

// rawRequest publishes data on subject as a raw request and waits up to
// wait for its reply: refused is the permissions violation that names the
// subject, m nil when no reply came.
func rawRequest(nc *nats.Conn, subject string, data []byte, wait time.Duration) (m *nats.Msg, refused error) {
	reply := nc.NewInbox()
	sub, err := nc.SubscribeSync(reply)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := refusedPublish(nc, &nats.Msg{Subject: subject, Reply: reply, Data: data}); err != nil {
		return nil, err
	}
	m, _ = sub.NextMsg(wait)
	return m, nil
}

// jsRequest publishes a JetStream API request as a raw message and returns
// the refusal: a permissions violation, or an API error in the reply.
func jsRequest(ctx context.Context, nc *nats.Conn, subject string, body any) error {
	var data []byte // nil: an empty body (a direct get with its subject in the API subject)
	if body != nil {
		data, _ = json.Marshal(body)
	}
	m, err := rawRequest(nc, subject, data, 5*time.Second)
	if err != nil || m == nil {
		return err // nil when no refusal came: treat as accepted (the snapshot decides)
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if json.Unmarshal(m.Data, &resp) == nil && resp.Error != nil {
		return fmt.Errorf("JetStream refused: %d %s", resp.Error.Code, resp.Error.Description)
	}
	return nil
}

// pushConsumerInto is the consumer-as-publisher attack: a push consumer on
// stream whose deliver subject is a Brood subject (in deliverGroup).
func pushConsumerInto(stream, deliver, group string) func(ctx context.Context, t *testing.T, nc *nats.Conn) error {
	return func(ctx context.Context, t *testing.T, nc *nats.Conn) error {
		name := "forged" + strconv.Itoa(len(deliver))
		return jsRequest(ctx, nc, "$JS.API.CONSUMER.CREATE."+stream+"."+name, map[string]any{
			"stream_name": stream,
			"config": map[string]any{"name": name, "deliver_subject": deliver, "deliver_group": group,
				"deliver_policy": "all", "ack_policy": "none"},
		})
	}
}

// coordCall sends a coordinator request on subject with nc (its user's
// inbox) and returns the error reply or transport failure.
func coordCall(ctx context.Context, nc *nats.Conn, subject string, req any) error {
	data, _ := protocol.Marshal(protocol.Msgpack, req)
	m, err := rawRequest(nc, subject, data, 10*time.Second)
	if err != nil || m == nil {
		return err
	}
	if perr := client.ErrorOf(m); perr != nil {
		return perr
	}
	return nil
}

func (f *forgery) clientAttempts(t *testing.T) {
	v := &f.victim
	own := v.root.Ref()
	f.run(t, "client", []attempt{
		{"read everyone's replies on _INBOX.>", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedSubscribe(nc, "_INBOX.>", "")
		}},
		{"read the trusted host's replies (grants)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedSubscribe(nc, "_INBOX.trusted-host.>", "")
		}},
		{"a consumer delivering into authority.user in the coordinators' queue group", pushConsumerInto("BROOD_LOG_spawn", authorityUser, protocol.CoordinatorQueue)},
		{"a consumer delivering into another child's inbox", pushConsumerInto("BROOD_LOG_spawn", "brood.v1.inbox.spawn."+v.child, "")},
		{"a durable consumer on BROOD_EVENTS", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return jsRequest(ctx, nc, "$JS.API.CONSUMER.DURABLE.CREATE.BROOD_EVENTS.hog", map[string]any{
				"stream_name": "BROOD_EVENTS", "config": map[string]any{"durable_name": "hog", "ack_policy": "explicit"}})
		}},
		{"read another user's log directly", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return jsRequest(ctx, nc, "$JS.API.DIRECT.GET.BROOD_LOG_spawn.brood.v1.log.spawn."+v.hostChild, nil)
		}},
		{"read another user's log through the coordinator", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			cl, _ := client.New(nc, client.Options{})
			_, err := cl.Log(ctx, protocol.LogReadRequest{SessionID: v.hostChild, Authority: v.root.Authority()})
			return wantCode(err, protocol.CodeUnauthorized)
		}},
		{"act on another user's child with a grant of its own", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			cl, _ := client.New(nc, client.Options{})
			_, err := cl.Followup(ctx, protocol.FollowupRequest{ChildID: v.hostChild, Authority: protocol.Authority{Grant: v.grant}, Message: protocol.Text("say forged")})
			return wantCode(err, protocol.CodeUnauthorized)
		}},
		{"read another user's log with a grant of its own", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			cl, _ := client.New(nc, client.Options{})
			_, err := cl.Log(ctx, protocol.LogReadRequest{SessionID: v.hostChild, Authority: protocol.Authority{Grant: v.grant}})
			return wantCode(err, protocol.CodeUnauthorized)
		}},
		{"mint a grant over every session", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return coordCall(ctx, nc, authorityUser, protocol.Empty{})
		}},
		{"call as another user", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return coordCall(ctx, nc, "brood.v1.user.trusted-host.authority.user", protocol.Empty{})
		}},
		{"runs.start with notify under another user's inbox", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return wantCode(coordCall(ctx, nc, "brood.v1.user.client.runs.start", protocol.RunStartRequest{
				Parent: v.root.Ref(), Provider: spawnworker.DefaultName, Prompt: protocol.Text("say forged"),
				Notify: "_INBOX.trusted-host.notify.victim"}), protocol.CodeInvalidArgument)
		}},
		{"learn whether a run exists (runs.await of another's run, of none)", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			cl, _ := client.New(nc, client.Options{})
			_, err1 := cl.Await(ctx, protocol.RunRef{RunID: v.hostRun.RunID, Parent: &own})
			_, err2 := cl.Await(ctx, protocol.RunRef{RunID: "NOSUCHRUN", Parent: &own})
			_, err3 := cl.Await(ctx, protocol.RunRef{RunID: v.hostRun.RunID, Grant: v.grant})
			_, err4 := cl.Await(ctx, protocol.RunRef{RunID: "NOSUCHRUN", Grant: v.grant})
			for _, err := range []error{err1, err2, err3, err4} {
				if protocol.CodeOf(err) != protocol.CodeUnauthorized {
					return nil
				}
			}
			if strings.ReplaceAll(err1.Error(), v.hostRun.RunID, "X") != strings.ReplaceAll(err2.Error(), "NOSUCHRUN", "X") ||
				strings.ReplaceAll(err3.Error(), v.hostRun.RunID, "X") != strings.ReplaceAll(err4.Error(), "NOSUCHRUN", "X") {
				return nil // the answers tell the two apart
			}
			return err1
		}},
		{"dispose another user's run", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			cl, _ := client.New(nc, client.Options{})
			_, err := cl.Dispose(ctx, protocol.RunRef{RunID: v.hostRun.RunID, Parent: &own})
			return wantCode(err, protocol.CodeUnauthorized)
		}},
		{"write a log record", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedPublish(nc, &nats.Msg{Subject: "brood.v1.log.spawn." + v.child, Data: []byte("forged")})
		}},
		{"write an inbox item", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedPublish(nc, &nats.Msg{Subject: "brood.v1.inbox.spawn." + v.child, Data: []byte("forged")})
		}},
		{"write a lease", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedPublish(nc, &nats.Msg{Subject: "$KV.brood_agents." + v.root.SessionID, Data: []byte("forged")})
		}},
		{"create a stream on the coordinator's subjects", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return jsRequest(ctx, nc, "$JS.API.STREAM.CREATE.HIJACK", map[string]any{"name": "HIJACK", "subjects": []string{"brood.v1.coord.>"}})
		}},
		{"serve the coordinator's endpoints", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedSubscribe(nc, "brood.v1.user.*.authority.user", protocol.CoordinatorQueue)
		}},
		{"serve a provider", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedSubscribe(nc, "brood.v1.provider.>", protocol.ProviderQueue)
		}},
	})
}

func (f *forgery) workerAttempts(t *testing.T) {
	v := &f.victim
	f.run(t, "worker-spawn", []attempt{
		{"wipe every log of its provider (max_msgs_per_subject 1)", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			info, err := f.js.Stream(ctx, "BROOD_LOG_spawn")
			if err != nil {
				return nil
			}
			cfg := info.CachedInfo().Config
			cfg.MaxMsgsPerSubject = 1
			return jsRequest(ctx, nc, "$JS.API.STREAM.UPDATE.BROOD_LOG_spawn", cfg)
		}},
		{"take every coordinator endpoint down with a stream on brood.v1.coord.>", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return jsRequest(ctx, nc, "$JS.API.STREAM.CREATE.HIJACK", map[string]any{"name": "HIJACK", "subjects": []string{"brood.v1.coord.>"}})
		}},
		{"purge every lease with a roll-up", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			js, _ := jetstream.New(nc)
			m := nats.NewMsg("$KV.brood_agents.forged")
			m.Header.Set("Nats-Rollup", "all")
			_, err := js.PublishMsg(ctx, m)
			return err
		}},
		{"purge a session's log with a roll-up", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			js, _ := jetstream.New(nc)
			m := nats.NewMsg("brood.v1.log.spawn." + v.child)
			m.Header.Set("Nats-Rollup", "sub")
			_, err := js.PublishMsg(ctx, m)
			return err
		}},
		{"a consumer delivering into authority.user in the coordinators' queue group", pushConsumerInto("BROOD_LOG_spawn", authorityUser, protocol.CoordinatorQueue)},
		{"a consumer delivering into a coordinator endpoint", pushConsumerInto("KV_brood_agents", "brood.v1.user.worker-spawn.runs.start", protocol.CoordinatorQueue)},
		{"mint a grant", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			if err := coordCall(ctx, nc, authorityUser, protocol.Empty{}); err == nil {
				return nil
			}
			return coordCall(ctx, nc, "brood.v1.user.worker-spawn.authority.user", protocol.Empty{})
		}},
		{"write a session header", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedPublish(nc, &nats.Msg{Subject: "brood.v1.session.FORGED", Data: []byte("forged")})
		}},
		{"forge a user grant record (grant.<hash>)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			// What a KV put of the record publishes.
			data, _ := protocol.Marshal(protocol.Msgpack, protocol.UserGrantRecord{ExpiresAt: store.NowMs() + 3600_000, MintedBy: "forged"})
			return refusedPublish(nc, &nats.Msg{Subject: "$KV.brood_agents." + store.GrantKey(protocol.HashCredential("forged-grant")), Reply: nc.NewInbox(), Data: data})
		}},
		{"lift the drain or free slots (drain and slot records)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			if err := refusedPublish(nc, &nats.Msg{Subject: "$KV.brood_agents." + store.DrainKey(store.DrainAll), Data: []byte("forged")}); err == nil {
				return nil
			}
			return refusedPublish(nc, &nats.Msg{Subject: "$KV.brood_agents." + store.SlotsKey(v.root.SessionID), Data: []byte("forged")})
		}},
		{"read the trusted host's replies", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedSubscribe(nc, "_INBOX.trusted-host.>", "")
		}},
		{"serve the coordinator's endpoints", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedSubscribe(nc, "brood.v1.user.*.runs.start", protocol.CoordinatorQueue)
		}},
		{"take every provider request for itself (outside the queue group)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedSubscribe(nc, "brood.v1.provider.>", "")
		}},
		{"delete a log record", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return jsRequest(ctx, nc, "$JS.API.STREAM.MSG.DELETE.BROOD_LOG_spawn", map[string]any{"seq": 1})
		}},
	})
}

// otherProviderAttempts: the worker user of one provider (worker-spawn)
// against another provider's workers (the fork worker, user worker-fork):
// each provider's workers serve only their own provider's subjects and
// their own scope's host subjects, and write only their own scope's host
// records (issue 17, point 4; docs/security.md).
func (f *forgery) otherProviderAttempts(t *testing.T) {
	v := &f.victim
	f.run(t, "worker-spawn", []attempt{
		{"join the fork provider's queue group", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedSubscribe(nc, "brood.v1.provider.fork.>", protocol.ProviderQueue)
		}},
		{"serve the fork worker's start subject in its queue group", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedSubscribe(nc, "brood.v1.provider.fork."+v.forkHost+"."+protocol.OpProviderStart, protocol.ProviderQueue)
		}},
		{"answer the fork worker's host requests", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedSubscribe(nc, "brood.v1.host."+v.forkHost+".*", "")
		}},
		{"answer every host's requests", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedSubscribe(nc, "brood.v1.host.>", "")
		}},
		{"forge the fork worker's heartbeat and descriptor", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			// What a KV put of the record publishes.
			data, _ := protocol.Marshal(protocol.Msgpack, protocol.HostRecord{
				HostID: v.forkHost, Kind: protocol.HostWorker, Heartbeat: store.NowMs(), StartedAt: 1,
				Providers: []protocol.ProviderDescriptor{{Name: forkworker.DefaultName}},
			})
			return refusedPublish(nc, &nats.Msg{Subject: "$KV.brood_hosts." + store.HostKey(v.forkHost), Reply: nc.NewInbox(), Data: data})
		}},
		{"answer the fork provider's micro discovery", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedSubscribe(nc, "$SRV.INFO.brood-provider-fork", "")
		}},
		{"rewrite a root's lease (its credential hash)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			// What a KV put of the rewritten record publishes.
			data, _ := protocol.Marshal(protocol.Msgpack, protocol.AgentRecord{
				SessionID: v.root.SessionID, Kind: protocol.AgentRoot, HostID: "client", Epoch: 1,
				CredentialHash: protocol.HashCredential("forged-credential"), ExpiresAt: store.NowMs() + 3600_000,
			})
			return refusedPublish(nc, &nats.Msg{Subject: "$KV.brood_agents." + store.RootLeaseKey(v.root.SessionID), Reply: nc.NewInbox(), Data: data})
		}},
		{"rewrite a fork child's lease (its credential hash and host)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			// What a KV put of the rewritten record publishes, under the key
			// coordinators read the child's lease from (its header's provider).
			data, _ := protocol.Marshal(protocol.Msgpack, protocol.AgentRecord{
				SessionID: v.forkChild, Kind: protocol.AgentContinuable, HostID: protocol.WorkerHostID("spawn", "forger"), Epoch: 9,
				Provider: forkworker.DefaultName, CredentialHash: protocol.HashCredential("forged-credential"), ParentSession: v.root.SessionID,
			})
			return refusedPublish(nc, &nats.Msg{Subject: "$KV.brood_agents." + store.LeaseKey(forkworker.DefaultName, v.forkChild), Reply: nc.NewInbox(), Data: data})
		}},
		{"settle a fork run with a forged result (its state)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			// What a KV compare-and-set of the settled record publishes,
			// under the key every reader takes the run's state from (its
			// spec's provider).
			res := protocol.SubagentResult{Output: protocol.Text("forged result"), StopReason: protocol.StopCompleted}
			data, _ := protocol.Marshal(protocol.Msgpack, protocol.RunRecord{
				RunID: v.forkRun.RunID, ChildID: v.forkRun.ChildID, ParentSession: v.root.SessionID, Provider: forkworker.DefaultName,
				Mode: protocol.ModeOneShot, State: protocol.RunSettled, SettledAt: store.NowMs(), SettledBy: protocol.WorkerHostID("spawn", "forger"), Result: &res,
			})
			return refusedPublish(nc, &nats.Msg{Subject: "$KV.brood_runs." + store.RunStateKey(forkworker.DefaultName, v.forkRun.RunID), Reply: nc.NewInbox(), Data: data})
		}},
		{"rewrite a run's spec (its provider and notify subject)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			data, _ := protocol.Marshal(protocol.Msgpack, protocol.RunRecord{
				RunID: v.forkRun.RunID, ChildID: v.forkRun.ChildID, ParentSession: v.root.SessionID, Provider: spawnworker.DefaultName,
				Mode: protocol.ModeOneShot, Notify: "_INBOX.worker-spawn.stolen", State: protocol.RunRunning,
			})
			return refusedPublish(nc, &nats.Msg{Subject: "$KV.brood_runs." + store.RunSpecKey(forkworker.DefaultName, v.forkRun.RunID), Reply: nc.NewInbox(), Data: data})
		}},
		{"publish a forged result into the client's inbox (a fork run's notify subject)", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			// The notify subject, read as admin: a worker may no longer read
			// another provider's spec ("read a fork run's spec" below), so
			// this is an attacker that learned it otherwise.
			m, err := f.admin.RequestWithContext(ctx, "$JS.API.DIRECT.GET.KV_brood_runs.$KV.brood_runs."+store.RunSpecKey(forkworker.DefaultName, v.forkRun.RunID), nil)
			if err != nil {
				return fmt.Errorf("read the run's spec: %w", err)
			}
			var spec protocol.RunRecord
			if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &spec); err != nil || !strings.HasPrefix(spec.Notify, "_INBOX.client.") {
				return fmt.Errorf("the run's spec names notify %q (%v), not the client's inbox", spec.Notify, err)
			}
			data, _ := protocol.Marshal(protocol.Msgpack, protocol.RunNotice{RunID: v.forkRun.RunID, ChildID: v.forkRun.ChildID, ParentSession: v.root.SessionID,
				Provider: forkworker.DefaultName, Result: protocol.SubagentResult{Output: protocol.Text("forged result"), StopReason: protocol.StopCompleted}})
			return refusedPublish(nc, &nats.Msg{Subject: spec.Notify, Data: data})
		}},
		{"ask for the notice of a fork run (brood.v1.notice.fork.<runId>)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedPublish(nc, &nats.Msg{Subject: "brood.v1.notice.fork." + v.forkRun.RunID})
		}},
		{"put a forged prompt into the client's root's inbox", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			data, _ := protocol.Marshal(protocol.Msgpack, protocol.InboxItem{Content: protocol.Text("forged prompt"),
				Source: protocol.MessageSource{Kind: protocol.SourceSubagentSettled, Form: "notice", SenderSessionID: v.forkChild}})
			return refusedPublish(nc, &nats.Msg{Subject: "brood.v1.inbox.root." + v.root.SessionID, Reply: nc.NewInbox(), Data: data})
		}},
		{"put a forged message into a fork child's inbox", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			data, _ := protocol.Marshal(protocol.Msgpack, protocol.InboxItem{Content: protocol.Text("forged followup")})
			return refusedPublish(nc, &nats.Msg{Subject: "brood.v1.inbox.fork." + v.forkChild, Reply: nc.NewInbox(), Data: data})
		}},
		{"wake a fork child or its own provider's child", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			if err := refusedPublish(nc, &nats.Msg{Subject: "brood.v1.wake.fork." + v.forkChild}); err == nil {
				return nil
			}
			return refusedPublish(nc, &nats.Msg{Subject: "brood.v1.wake.spawn." + v.child})
		}},
		{"write an ownership record (keep the client's root from settling)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			// What a KV put of the record publishes: an edge root → a fork
			// child, which only coordinators add.
			data, _ := protocol.Marshal(protocol.Msgpack, protocol.OwnershipRecord{Children: []string{v.forkChild}})
			return refusedPublish(nc, &nats.Msg{Subject: "$KV.brood_agents." + store.OwnsKey(protocol.ScopeRoot, v.root.SessionID), Reply: nc.NewInbox(), Data: data})
		}},
		{"ask for the end of a fork child's epoch (brood.v1.epochend.fork.<childId>)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			data, _ := protocol.Marshal(protocol.Msgpack, protocol.EpochEndRequest{Owner: v.root.SessionID, RunID: v.forkRun.RunID})
			return refusedPublish(nc, &nats.Msg{Subject: "brood.v1.epochend.fork." + v.forkChild, Reply: nc.NewInbox(), Data: data})
		}},
		{"ask, under its own provider, for the end of a fork child's epoch", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			// The subject is its own provider's; the run is a fork run of
			// another child, and no epoch.
			return wantCode(coordCall(ctx, nc, "brood.v1.epochend.spawn."+v.forkChild,
				protocol.EpochEndRequest{Owner: v.root.SessionID, RunID: v.forkRun.RunID}), protocol.CodeUnauthorized)
		}},
		{"delete a pending item of the client's root's inbox by its sequence", func(ctx context.Context, t *testing.T, nc *nats.Conn) error {
			// The sequence as a JSON number (protocol.Seq encodes as a
			// string, which JetStream would refuse as invalid JSON).
			return jsRequest(ctx, nc, "$JS.API.STREAM.MSG.DELETE.BROOD_INBOX_root", map[string]any{"seq": uint64(f.pendingItem(ctx, t, v.root.SessionID))})
		}},
		{"ask for the deletion of a fork child's inbox items (brood.v1.inboxremove.fork.<childId>)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			data, _ := protocol.Marshal(protocol.Msgpack, protocol.InboxRemoveRequest{Seqs: []protocol.Seq{1}})
			return refusedPublish(nc, &nats.Msg{Subject: "brood.v1.inboxremove.fork." + v.forkChild, Reply: nc.NewInbox(), Data: data})
		}},
		{"ask, under its own provider, for the deletion of the client's root's pending items", func(ctx context.Context, t *testing.T, nc *nats.Conn) error {
			return wantCode(coordCall(ctx, nc, "brood.v1.inboxremove.spawn."+v.root.SessionID,
				protocol.InboxRemoveRequest{Seqs: []protocol.Seq{f.pendingItem(ctx, t, v.root.SessionID)}}), protocol.CodeUnauthorized)
		}},
		{"ask, under its own provider, for the deletion of another session's pending item as its own child's", func(ctx context.Context, t *testing.T, nc *nats.Conn) error {
			// (A root's items are in BROOD_INBOX_root: a sequence the child's
			// request names is one of BROOD_INBOX_spawn.)
			return wantCode(coordCall(ctx, nc, "brood.v1.inboxremove.spawn."+v.child,
				protocol.InboxRemoveRequest{Seqs: []protocol.Seq{v.spawnPending}}), protocol.CodeInvalidArgument)
		}},
		{"publish a forged end of a fork run (brood.v1.events.fork.<root>.end)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			data, _ := protocol.Marshal(protocol.Msgpack, protocol.LifecycleEvent{Type: protocol.LifecycleEnd, RunID: v.forkRun.RunID, Provider: forkworker.DefaultName,
				ID: v.forkRun.ChildID, ParentSession: v.root.SessionID, Mode: protocol.ModeOneShot, StopReason: protocol.StopCompleted,
				LastAssistantMessage: protocol.Text("forged result")})
			return refusedPublish(nc, &nats.Msg{Subject: "brood.v1.events.fork." + v.root.SessionID + ".end", Reply: nc.NewInbox(), Data: data})
		}},
		{"publish a forged start of a fork child on the subjects of before (brood.v1.events.<root>.start)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			data, _ := protocol.Marshal(protocol.Msgpack, protocol.LifecycleEvent{Type: protocol.LifecycleStart, RunID: "FORGED", Provider: forkworker.DefaultName,
				ID: v.forkChild, ParentSession: v.root.SessionID, Mode: protocol.ModeContinuable})
			return refusedPublish(nc, &nats.Msg{Subject: "brood.v1.events." + v.root.SessionID + ".start", Reply: nc.NewInbox(), Data: data})
		}},
		{"read a fork child's log (BROOD_LOG_fork: its prompts and outputs) by any get", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return everyGetRefused(ctx, nc, "BROOD_LOG_fork", "brood.v1.log.fork."+v.forkChild)
		}},
		{"read a fork child's inbox (BROOD_INBOX_fork) by any get", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return everyGetRefused(ctx, nc, "BROOD_INBOX_fork", "brood.v1.inbox.fork."+v.forkChild)
		}},
		{"read the client's root's inbox (BROOD_INBOX_root: its children's results) by any get", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return everyGetRefused(ctx, nc, "BROOD_INBOX_root", "brood.v1.inbox.root."+v.root.SessionID)
		}},
		{"read a root's log (BROOD_LOG_root) by any get", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return everyGetRefused(ctx, nc, "BROOD_LOG_root", "brood.v1.log.root."+v.hostRoot.SessionID)
		}},
		{"read the acp provider's logs (BROOD_LOG_acp) by any get", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return everyGetRefused(ctx, nc, "BROOD_LOG_acp", "brood.v1.log.acp.>")
		}},
		{"read a fork run's end (its result text) from BROOD_EVENTS", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			// Every way to get a message: a direct get by its subject (in the
			// body, and in the API subject), a leader get.
			end := "brood.v1.events.fork." + v.root.SessionID + ".end"
			for _, get := range []struct {
				subject string
				body    any
			}{
				{"$JS.API.DIRECT.GET.BROOD_EVENTS", map[string]any{"last_by_subj": end}},
				{"$JS.API.DIRECT.GET.BROOD_EVENTS." + end, nil},
				{"$JS.API.STREAM.MSG.GET.BROOD_EVENTS", map[string]any{"last_by_subj": end}},
			} {
				if err := jsRequest(ctx, nc, get.subject, get.body); err == nil {
					return nil
				}
			}
			return errors.New("every get refused")
		}},
		{"publish into a coordinator's inbox (a forged JetStream answer or KV watch delivery)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedPublish(nc, &nats.Msg{Subject: v.coordInbox, Data: []byte(`{"type":"io.nats.jetstream.api.v1.stream_msg_get_response"}`)})
		}},
		{"answer a coordinator's request to a fork host (_INBOX.coordinator.host.fork.…)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			data, _ := protocol.Marshal(protocol.Msgpack, protocol.StateReply{State: protocol.StateNone})
			return refusedPublish(nc, &nats.Msg{Subject: "_INBOX.coordinator." + rpc.HostRepliesToken + ".fork.ID.T1", Data: data})
		}},
		{"see every inbox item as it is accepted (brood.v1.inbox.*.*: every user's prompts, followups and results)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedSubscribe(nc, "brood.v1.inbox.*.*", "")
		}},
		{"see the client's root's and a fork child's inbox items as they are accepted", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			if err := refusedSubscribe(nc, "brood.v1.inbox.root."+v.root.SessionID, ""); err == nil {
				return nil
			}
			return refusedSubscribe(nc, "brood.v1.inbox.fork."+v.forkChild, "")
		}},
		{"learn when a fork child or a root is woken (brood.v1.wake.fork.<childId>, brood.v1.wake.root.<rootId>)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			if err := refusedSubscribe(nc, "brood.v1.wake.fork."+v.forkChild, ""); err == nil {
				return nil
			}
			return refusedSubscribe(nc, "brood.v1.wake.root."+v.root.SessionID, "")
		}},
		// KV records of another provider (docs/security.md, "What comes
		// next", item 3): every way to read one.
		{"read a fork run's spec (its notify subject, parent, prompt's run)", kvReads("brood_runs", store.RunSpecKey(forkworker.DefaultName, v.forkRun.RunID), store.RunSpecPattern(v.forkRun.RunID))},
		{"read a fork run's state (its result)", kvReads("brood_runs", store.RunStateKey(forkworker.DefaultName, v.forkRun.RunID), "state.*."+v.forkRun.RunID)},
		{"read a fork child's lease", kvReads("brood_agents", store.LeaseKey(forkworker.DefaultName, v.forkChild), "lease.*."+v.forkChild)},
		{"read a fork child's ownership record", kvReads("brood_agents", store.OwnsKey(forkworker.DefaultName, v.forkChild), "owns.*."+v.forkChild)},
		{"read a root's ownership record", kvReads("brood_agents", store.OwnsKey(protocol.ScopeRoot, v.root.SessionID), "owns.*."+v.root.SessionID)},
		{"append to a fork child's session log", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return forgedAppend(ctx, nc, "brood.v1.log.fork."+v.forkChild)
		}},
		{"append to a root's session log", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return forgedAppend(ctx, nc, "brood.v1.log.root."+v.root.SessionID)
		}},
	})
}

// kvReads tries every way a worker (of provider spawn) could read key of
// bucket: a direct get with the key in the API subject, and with pattern
// (the key under every provider's prefix); a batch direct get (the key in
// its body); a leader get; a consumer on the key (what a KV watch creates); the
// coordinators' leader read, on the other provider's subject and on its
// own. It returns nil when any answered, naming it in the log.
func kvReads(bucket, key, pattern string) func(ctx context.Context, t *testing.T, nc *nats.Conn) error {
	return func(ctx context.Context, t *testing.T, nc *nats.Conn) error {
		stream, subject := "KV_"+bucket, "$KV."+bucket+"."+key
		gets := []struct {
			subject string
			body    any
		}{
			{"$JS.API.DIRECT.GET." + stream + "." + subject, nil},
			{"$JS.API.DIRECT.GET." + stream + ".$KV." + bucket + "." + pattern, nil},
			{"$JS.API.DIRECT.GET." + stream, map[string]any{"last_by_subj": subject}},
			{"$JS.API.DIRECT.GET." + stream, map[string]any{"multi_last": []string{subject}, "batch": 10}},
			{"$JS.API.STREAM.MSG.GET." + stream, map[string]any{"last_by_subj": subject}},
			{"$JS.API.CONSUMER.CREATE." + stream, map[string]any{"stream_name": stream, "config": map[string]any{
				"filter_subject": subject, "deliver_policy": "last_per_subject", "ack_policy": "none", "inactive_threshold": int64(10 * time.Second)}}},
		}
		for _, get := range gets {
			if err := jsRequest(ctx, nc, get.subject, get.body); err == nil {
				t.Logf("answered: %s %v", get.subject, get.body)
				return nil
			}
		}
		subj := protocol.MustSubjects("")
		if err := coordCall(ctx, nc, subj.KVLatest(forkworker.DefaultName, bucket), protocol.KVLatestRequest{Key: key}); err == nil {
			t.Logf("answered: the coordinators' leader read on the fork provider's subject")
			return nil
		}
		if err := wantCode(coordCall(ctx, nc, subj.KVLatest(spawnworker.DefaultName, bucket), protocol.KVLatestRequest{Key: key}), protocol.CodeUnauthorized); err == nil {
			t.Logf("answered: the coordinators' leader read on its own provider's subject")
			return nil
		}
		return errors.New("every read refused")
	}
}

// pendingItem is the inbox sequence of a pending item of session id (the
// settlement notice of one of its idle children), read as admin.
// directGet sends a direct get (body "" for the subject in the API
// subject) and returns how it was refused: a permissions violation, or a
// status in the reply (404, 408); nil when a message came back.
func directGet(nc *nats.Conn, subject string, body []byte) error {
	m, err := rawRequest(nc, subject, body, 10*time.Second)
	switch {
	case err != nil:
		return err
	case m == nil:
		return errors.New("no answer")
	}
	if st := m.Header.Get("Status"); st != "" {
		return fmt.Errorf("JetStream answered %s %s", st, m.Header.Get("Description"))
	}
	return nil
}

// crossProviderReads: a worker reads no session header (of another
// provider's child, of a root), and what it reads across providers through
// the coordinators (protocol.Subjects.Read) is answered for its own
// provider's children only: no fork seed past the fork point, none of a
// child that is no fork of the parent named, no ancestry of another
// provider's child.
func (f *forgery) crossProviderReads(t *testing.T) {
	v := &f.victim
	subj := protocol.MustSubjects("")
	seedChild := v.seedRun.ChildID
	lastBySubj := func(subject string) []byte {
		b, _ := json.Marshal(map[string]string{"last_by_subj": subject})
		return b
	}
	f.run(t, "worker-spawn", []attempt{
		{"read a fork child's header (a direct get by subject)", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return directGet(nc, "$JS.API.DIRECT.GET.BROOD_SESSIONS."+subj.Session(seedChild), nil)
		}},
		{"read a root's header (a direct get by subject)", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return directGet(nc, "$JS.API.DIRECT.GET.BROOD_SESSIONS."+subj.Session(v.root.SessionID), nil)
		}},
		{"read a fork child's header (a batch direct get)", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return directGet(nc, "$JS.API.DIRECT.GET.BROOD_SESSIONS", lastBySubj(subj.Session(seedChild)))
		}},
		{"read a root's header from the stream's leader", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return jsRequest(ctx, nc, "$JS.API.STREAM.MSG.GET.BROOD_SESSIONS", map[string]string{"last_by_subj": subj.Session(v.seedRoot.SessionID)})
		}},
		{"read a fork child's seed on the fork provider's subject", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return coordCall(ctx, nc, subj.Read(forkworker.DefaultName, protocol.ReadForkSeed, seedChild), protocol.ForkSeedRequest{Parent: v.seedRoot.SessionID})
		}},
		{"read a fork child's seed on its own provider's subject", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return wantCode(coordCall(ctx, nc, subj.Read(spawnworker.DefaultName, protocol.ReadForkSeed, seedChild), protocol.ForkSeedRequest{Parent: v.seedRoot.SessionID}), protocol.CodeUnauthorized)
		}},
		{"read the ancestry of a fork child on its own provider's subject", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return wantCode(coordCall(ctx, nc, subj.Read(spawnworker.DefaultName, protocol.ReadAncestry, v.forkChild), protocol.Empty{}), protocol.CodeUnauthorized)
		}},
		{"read the ancestry of a fork child on the fork provider's subject", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return coordCall(ctx, nc, subj.Read(forkworker.DefaultName, protocol.ReadAncestry, v.forkChild), protocol.Empty{})
		}},
	})
	f.run(t, "worker-fork", []attempt{
		{"read the fork parent's log past the fork point", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return wantCode(coordCall(ctx, nc, subj.Read(forkworker.DefaultName, protocol.ReadForkSeed, seedChild),
				protocol.ForkSeedRequest{Parent: v.seedRoot.SessionID, FromSeq: v.seedLen}), protocol.CodeUnauthorized)
		}},
		{"read a root's log through a fork child of another root", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return wantCode(coordCall(ctx, nc, subj.Read(forkworker.DefaultName, protocol.ReadForkSeed, seedChild),
				protocol.ForkSeedRequest{Parent: v.hostRoot.SessionID}), protocol.CodeUnauthorized)
		}},
		{"read a root's log through its fork child that has no seed", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return wantCode(coordCall(ctx, nc, subj.Read(forkworker.DefaultName, protocol.ReadForkSeed, v.forkChild),
				protocol.ForkSeedRequest{Parent: v.root.SessionID}), protocol.CodeUnauthorized)
		}},
		{"read the ancestry of a spawn child", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return wantCode(coordCall(ctx, nc, subj.Read(forkworker.DefaultName, protocol.ReadAncestry, v.child), protocol.Empty{}), protocol.CodeUnauthorized)
		}},
		{"read a spawn child's header (a direct get by subject)", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return directGet(nc, "$JS.API.DIRECT.GET.BROOD_SESSIONS."+subj.Session(v.child), nil)
		}},
	})
}

func (f *forgery) pendingItem(ctx context.Context, t *testing.T, id string) protocol.Seq {
	t.Helper()
	str, err := f.js.Stream(ctx, "BROOD_INBOX_root")
	if err != nil {
		t.Fatal(err)
	}
	m, err := str.GetLastMsgForSubject(ctx, "brood.v1.inbox.root."+id)
	if err != nil {
		t.Fatalf("no pending item of %s to aim at: %v", id, err)
	}
	return protocol.Seq(m.Sequence)
}

// forgedAppend publishes a forged log record (turn/end) on subject through
// JetStream and returns the refusal.
func forgedAppend(ctx context.Context, nc *nats.Conn, subject string) error {
	ev, _ := protocol.NewEvent(protocol.EvTurnEnd, store.NowMs(), protocol.TurnEndData{Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}})
	data, _ := protocol.Marshal(protocol.Msgpack, protocol.LogRecord{Events: []protocol.SessionEvent{ev}})
	if err := refusedPublish(nc, &nats.Msg{Subject: subject, Reply: nc.NewInbox(), Data: data}); err != nil {
		return err
	}
	js, _ := jetstream.New(nc)
	_, err := js.Publish(ctx, subject, data)
	return err
}

// forkWorkerAttempts: the fork provider's workers, whose seeds come from
// the coordinators, read no log or inbox but their own provider's.
func (f *forgery) forkWorkerAttempts(t *testing.T) {
	v := &f.victim
	f.run(t, "worker-fork", []attempt{
		{"read a spawn child's log (BROOD_LOG_spawn: a fork parent's history past its fork point) by any get", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return everyGetRefused(ctx, nc, "BROOD_LOG_spawn", "brood.v1.log.spawn."+v.child)
		}},
		{"read a root's log (BROOD_LOG_root) by any get", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return everyGetRefused(ctx, nc, "BROOD_LOG_root", "brood.v1.log.root."+v.hostRoot.SessionID)
		}},
		{"read a spawn child's inbox (BROOD_INBOX_spawn) by any get", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return everyGetRefused(ctx, nc, "BROOD_INBOX_spawn", "brood.v1.inbox.spawn."+v.child)
		}},
		{"read the client's root's inbox (BROOD_INBOX_root) by any get", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return everyGetRefused(ctx, nc, "BROOD_INBOX_root", "brood.v1.inbox.root."+v.root.SessionID)
		}},
	})
}

// everyGetRefused tries every way to read subject (a wildcard allowed) of
// stream: a batch direct get from the first sequence, a direct get of its
// last message by the body, one with the subject in the API subject, a
// leader get, and the stream's info listing its subjects (which names every
// session). It returns nil as soon as the server lets one through (whatever
// it answers: even "no message found" says whether the subject holds
// anything), and the last refusal (a permissions violation) when none was.
func everyGetRefused(ctx context.Context, nc *nats.Conn, stream, subject string) error {
	var refused error
	for _, get := range []struct {
		api  string
		body any
	}{
		{"$JS.API.DIRECT.GET." + stream, map[string]any{"seq": 1, "next_by_subj": subject, "batch": 10}},
		{"$JS.API.DIRECT.GET." + stream, map[string]any{"last_by_subj": subject}},
		{"$JS.API.DIRECT.GET." + stream + "." + subject, nil},
		{"$JS.API.STREAM.MSG.GET." + stream, map[string]any{"last_by_subj": subject}},
		{"$JS.API.STREAM.INFO." + stream, map[string]any{"subjects_filter": subject}},
	} {
		var data []byte
		if get.body != nil {
			data, _ = json.Marshal(get.body)
		}
		sub, err := nc.SubscribeSync(nc.NewInbox())
		if err != nil {
			return err
		}
		err = refusedPublish(nc, &nats.Msg{Subject: get.api, Reply: sub.Subject, Data: data})
		if err == nil {
			_ = sub.Unsubscribe()
			return nil // let through (answered or not)
		}
		_ = sub.Unsubscribe()
		refused = err
	}
	return refused
}

func (f *forgery) trustedHostAttempts(t *testing.T) {
	v := &f.victim
	f.run(t, "trusted-host", []attempt{
		{"a consumer delivering into authority.user", pushConsumerInto("BROOD_LOG_root", authorityUser, protocol.CoordinatorQueue)},
		{"write a grant record", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedPublish(nc, &nats.Msg{Subject: "$KV.brood_agents.grant.forged", Data: []byte("forged")})
		}},
		{"write an inbox item", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedPublish(nc, &nats.Msg{Subject: "brood.v1.inbox.spawn." + v.child, Data: []byte("forged")})
		}},
		{"append to a child's session log", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return forgedAppend(ctx, nc, "brood.v1.log.spawn."+v.hostChild)
		}},
		{"read a client's replies", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedSubscribe(nc, "_INBOX.client.>", "")
		}},
		{"call as the client", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return coordCall(ctx, nc, "brood.v1.user.client.providers.list", protocol.Empty{})
		}},
		{"update a stream", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return jsRequest(ctx, nc, "$JS.API.STREAM.DELETE.BROOD_INBOX_root", nil)
		}},
	})
}

func (f *forgery) coordinatorAttempts(t *testing.T) {
	f.run(t, "coordinator", []attempt{
		{"wipe every log", func(ctx context.Context, _ *testing.T, nc *nats.Conn) error {
			return jsRequest(ctx, nc, "$JS.API.STREAM.PURGE.BROOD_LOG_spawn", nil)
		}},
		{"read a client's replies", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedSubscribe(nc, "_INBOX.client.>", "")
		}},
	})
}

// wantCode returns err when it carries code, nil otherwise (the attempt was
// not refused as it should be).
func wantCode(err error, code protocol.Code) error {
	if protocol.CodeOf(err) == code {
		return err
	}
	return nil
}

var (
	broodBinOnce sync.Once
	broodBinPath string
	broodBinErr  error
)

// broodBinary builds the brood binary once for the CLI subtests.
func broodBinary(t *testing.T) string {
	t.Helper()
	broodBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "brood-deploy-")
		if err != nil {
			broodBinErr = err
			return
		}
		broodBinPath = filepath.Join(dir, "brood")
		out, err := exec.Command("go", "build", "-o", broodBinPath, "../cmd/brood").CombinedOutput()
		if err != nil {
			broodBinErr = fmt.Errorf("go build: %v: %s", err, out)
		}
	})
	if broodBinErr != nil {
		t.Fatal(broodBinErr)
	}
	return broodBinPath
}

// brood runs the CLI as user (its password in the environment, never on the
// command line) and returns stdout, stderr and the exit status.
func (f *forgery) brood(t *testing.T, user string, args ...string) (string, string, int) {
	t.Helper()
	cmd, out, errb := f.broodCmd(t, user, args...)
	err := cmd.Run()
	return out.String(), errb.String(), exitCode(t, args, err)
}

// broodCmd is the command of brood as user (killed after broodTimeout), with
// its stdout and stderr buffers.
func (f *forgery) broodCmd(t *testing.T, user string, args ...string) (*exec.Cmd, *syncBuffer, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), broodTimeout)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, broodBinary(t), args...)
	cmd.Env = append(os.Environ(), "BROOD_NATS_URL="+f.all, "BROOD_NATS_USER="+user, "BROOD_NATS_PASSWORD="+passwordOf(t, user))
	out, errb := &syncBuffer{}, &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, errb
	return cmd, out, errb
}

// broodTimeout bounds one brood command of the suite: a verb that hangs
// fails its subtest instead of the whole test binary.
const broodTimeout = 90 * time.Second

// exitCode is the exit status of a finished brood command.
func exitCode(t *testing.T, args []string, err error) int {
	t.Helper()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		return ee.ExitCode()
	} else if err != nil {
		t.Fatalf("brood %v: %v", args, err)
	}
	return 0
}

// syncBuffer is a bytes.Buffer a running command writes while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// ok runs a verb as user that must succeed.
func (f *forgery) ok(t *testing.T, user string, args ...string) string {
	t.Helper()
	out, errs, code := f.brood(t, user, args...)
	if code != 0 {
		t.Fatalf("brood %s as %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), user, code, out, errs)
	}
	return out
}

// field returns the value after "name " on a line of out.
func field(t *testing.T, out, name string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %q line in:\n%s", name, out)
	return ""
}

// cliAsClient: `brood run`, `start`, `followup`, `log`, `watch`, `children`
// (and the other client verbs) all work as the client user, whose
// permissions are only its own coordinator subject and inbox prefix.
func (f *forgery) cliAsClient(t *testing.T) {
	if out := f.ok(t, "client", "providers"); !strings.Contains(out, "spawn") {
		t.Fatalf("brood providers:\n%s", out)
	}
	if out := f.ok(t, "client", "run", "--provider", "spawn", "say hello"); strings.TrimSpace(out) != "hello" {
		t.Fatalf("brood run: %q", out)
	}
	child := field(t, f.ok(t, "client", "start", "--provider", "spawn", "say started"), "childId")
	waitFor(t, 30*time.Second, "the started child idle", func() bool {
		out, _, code := f.brood(t, "client", "state", child)
		return code == 0 && strings.Contains(out, "none")
	})
	if out := f.ok(t, "client", "followup", "--wait", child, "say followed up"); !strings.Contains(out, "followed up") {
		t.Fatalf("brood followup --wait:\n%s", out)
	}
	if out := f.ok(t, "client", "result", child); !strings.Contains(out, "followed up") {
		t.Fatalf("brood result:\n%s", out)
	}
	if out := f.ok(t, "client", "log", child); !strings.Contains(out, "started") || !strings.Contains(out, "followed up") {
		t.Fatalf("brood log:\n%s", out)
	}
	if out := f.ok(t, "client", "children"); !strings.Contains(out, "CHILD") {
		t.Fatalf("brood children:\n%s", out)
	}
	// brood watch prints from now on: a run started once it watches is its event.
	watch, wout, werr := f.broodCmd(t, "client", "watch", "--count", "1", "--tree", "never")
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "brood watch watching", func() bool { return strings.Contains(werr.String(), "watching") })
	f.ok(t, "client", "run", "--provider", "spawn", "say watched")
	if code := exitCode(t, []string{"watch"}, watch.Wait()); code != 0 || !strings.Contains(wout.String(), "spawn") {
		t.Fatalf("brood watch: exit %d\nstdout: %s\nstderr: %s", code, wout.String(), werr.String())
	}
	grant := f.ok(t, "client", "grant")
	if !strings.Contains(grant, "scope the trees of the roots user client opened") {
		t.Fatalf("brood grant as client:\n%s", grant)
	}
	// The client's grant does not reach the trusted host's child.
	_, errs, code := f.brood(t, "client", "state", f.victim.hostChild)
	if code == 0 || !strings.HasPrefix(errs, string(protocol.CodeUnauthorized)) {
		t.Fatalf("brood state of another user's child as client: exit %d\n%s", code, errs)
	}
	// The trusted host acts on every session with --all-users.
	if out := f.ok(t, "trusted-host", "state", "--all-users", child); !strings.Contains(out, "none") {
		t.Fatalf("brood state --all-users as trusted-host:\n%s", out)
	}
	// A client disposes a continuable child of its own (idle: nothing to
	// end), with the grant of its own subject.
	if out := f.ok(t, "client", "dispose", child); !strings.Contains(out, "nothing to dispose") {
		t.Fatalf("brood dispose of the client's own child as client:\n%s", out)
	}
	// brood drain is the trusted host's, without --all-users.
	if out := f.ok(t, "trusted-host", "drain", "--list"); !strings.Contains(out, "SCOPE") {
		t.Fatalf("brood drain --list as trusted-host:\n%s", out)
	}
}

// cliNamesTheRole: a verb run as a user without the right fails at once,
// naming the subject NATS refused and the role the verb needs.
func (f *forgery) cliNamesTheRole(t *testing.T) {
	for _, tc := range []struct {
		user string
		args []string
		role string
	}{
		{"client", []string{"grant", "--all-users"}, "trusted-host"},
		{"client", []string{"state", "--all-users", f.victim.child}, "trusted-host"},
		{"client", []string{"drain", "--list"}, "trusted-host"},
		{"client", []string{"acp-agent"}, "trusted-host"},
		{"worker-spawn", []string{"ui", "--listen", "127.0.0.1:0"}, "client"},
		{"client", []string{"collector"}, "collector"},
		{"worker-spawn", []string{"grant"}, "client"},
		{"client", []string{"provision", "--replicas", "3", "--timeout", "10s"}, "admin"},
	} {
		began := time.Now()
		_, errs, code := f.brood(t, tc.user, tc.args...)
		if code == 0 || !strings.HasPrefix(errs, string(protocol.CodePermissionDenied)) || !strings.Contains(errs, "the role "+tc.role) {
			t.Errorf("brood %s as %s: exit %d\n%s\nwant PERMISSION_DENIED naming the role %s", strings.Join(tc.args, " "), tc.user, code, errs, tc.role)
		}
		if took := time.Since(began); took > 8*time.Second {
			t.Errorf("brood %s as %s took %s: not at once", strings.Join(tc.args, " "), tc.user, took)
		}
	}
}

// ownProviderEvents: a worker may publish lifecycle events under its own
// provider's subjects, so these are stored; what it says there about a
// child that is not its run's, or a run that never was, is never read
// (store.EventOfItsRun): the client's events.read of its root shows the
// same events before and after.
func (f *forgery) ownProviderEvents(t *testing.T) {
	v := &f.victim
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	read := func() []string {
		t.Helper()
		page, err := v.clientCl.Events(ctx, protocol.EventsReadRequest{Parent: v.root.SessionID, Authority: v.root.Authority(), EventsMax: protocol.EventsPageMax})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, ev := range page.Events {
			out = append(out, fmt.Sprintf("%s %s %s %s %s", ev.Type, ev.RunID, ev.ID, ev.Mode, protocol.PlainText(ev.LastAssistantMessage)))
		}
		return out
	}
	before := read()
	nc := connectAs(t, f.urls[1], "worker-spawn", nil)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range []protocol.LifecycleEvent{
		// The fork run's end, said of the client's spawn child.
		{RunID: v.forkRun.RunID, ID: v.child, Mode: protocol.ModeOneShot},
		// A run that never was, of the client's spawn child.
		{RunID: "FORGED", ID: v.child, Mode: protocol.ModeContinuable},
		// The trusted host's run, said of the client's root.
		{RunID: v.hostRun.RunID, ID: v.hostRun.ChildID, Mode: protocol.ModeOneShot},
	} {
		ev.Type, ev.Provider, ev.ParentSession = protocol.LifecycleEnd, spawnworker.DefaultName, v.root.SessionID
		ev.StopReason, ev.LastAssistantMessage = protocol.StopCompleted, protocol.Text("forged result")
		data, _ := protocol.Marshal(protocol.Msgpack, ev)
		if _, err := js.Publish(ctx, "brood.v1.events.spawn."+v.root.SessionID+".end", data); err != nil {
			t.Fatalf("publish under its own provider (allowed): %v", err)
		}
	}
	if after := read(); !slices.Equal(before, after) {
		t.Fatalf("the client's events changed:\nbefore %q\nafter  %q", before, after)
	}
}
