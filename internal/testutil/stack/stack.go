// Package stack runs a Brood deployment inside a test process: an embedded
// nats-server (or a cluster), coordinators, workers and a client. It builds
// the services, so only tests of the services and of the whole product use
// it; leaf packages' tests use internal/testutil alone.
package stack

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/embedded"
	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
	forkworker "github.com/brood-dev/brood/services/fork-worker"
	spawnworker "github.com/brood-dev/brood/services/spawn-worker"
)

// Timing of test stacks: fast heartbeats so host loss is judged in about a second.
const (
	Heartbeat  = 100 * time.Millisecond
	HostExpiry = time.Second
	// ContinueWaitMax is the test coordinators' bound on the wait of a run
	// whose host died for an instance to continue it (coordinator.Config;
	// 30 s in a deployment): a test with one worker sees HOST_LOST soon.
	ContinueWaitMax = time.Second
)

// Stack is a Brood deployment inside the test process: an embedded server,
// coordinators and workers, and a client.
type Stack struct {
	T testing.TB
	// Server is the embedded server (nil on a Cluster).
	Server *embedded.Server
	// URL is what the stack's services connect to (a cluster's URLs).
	URL    string
	NC     *nats.Conn
	Store  *store.Store
	Client *client.Client

	grantMu sync.Mutex // parallel subtests share the stack's grant
	grant   string
}

// New starts a server, provisions it and connects a client. Add
// coordinators and workers with the Add methods.
func New(t testing.TB) *Stack {
	t.Helper()
	return On(t, testutil.Server(t))
}

// On is New on a server the test started (to restart it).
func On(t testing.TB, s *embedded.Server) *Stack {
	t.Helper()
	return At(t, s, s.ClientURL())
}

// At is On whose services connect with url (a URL that carries a
// user and password, on a server with users).
func At(t testing.TB, s *embedded.Server, url string) *Stack {
	t.Helper()
	st := stackOnURL(t, url, store.DefaultConfig())
	st.Server = s
	return st
}

// OnCluster is New on a cluster: every connection may reach any
// node, and every stream and bucket has replicas copies.
func OnCluster(t testing.TB, c *testutil.Cluster, replicas int) *Stack {
	t.Helper()
	cfg := store.DefaultConfig()
	cfg.Replicas = replicas
	return stackOnURL(t, c.URLs(), cfg)
}

func stackOnURL(t testing.TB, url string, cfg store.Config) *Stack {
	t.Helper()
	nc := testutil.Connect(t, url)
	st := testutil.StoreWith(t, nc, cfg)
	cl, err := client.New(nc, client.Options{AwaitFallback: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &Stack{T: t, URL: url, NC: nc, Store: st, Client: cl}
}

// Conn opens another connection to the stack's server (one per service, as
// separate processes would have).
func (s *Stack) Conn() *nats.Conn { return testutil.Connect(s.T, s.URL) }

// AddCoordinator starts a coordinator replica on its own connection.
func (s *Stack) AddCoordinator(mod ...func(*coordinator.Config)) *coordinator.Coordinator {
	s.T.Helper()
	c, _ := s.StartCoordinator(mod...)
	return c
}

// StartCoordinator is AddCoordinator that also returns what stops the
// replica (as a SIGTERM does: it drains), for a test of a restart.
func (s *Stack) StartCoordinator(mod ...func(*coordinator.Config)) (*coordinator.Coordinator, func()) {
	s.T.Helper()
	nc := s.Conn()
	// The store is on the replica's own connection before the mods run, so
	// a mod may wrap it (store.WithFaults).
	cfg := coordinator.Config{NC: nc, Store: s.storeOn(nc), HeartbeatInterval: Heartbeat, HostExpiry: HostExpiry, ContinueWaitMax: ContinueWaitMax, Logger: testutil.Logger(s.T)}
	for _, m := range mod {
		m(&cfg)
	}
	c, err := coordinator.New(cfg)
	if err != nil {
		s.T.Fatal(err)
	}
	stop := testutil.Background(s.T, c)
	select {
	case <-c.Ready():
	case <-time.After(10 * time.Second):
		s.T.Fatal("coordinator not serving after 10s")
	}
	return c, stop
}

// AddKillableCoordinator is AddCoordinator whose replica kill stops as a
// crash does: its connection is closed first (nothing more it writes lands,
// its heartbeat record stays until it expires; kill returns once the
// server dropped the connection), then its Run is stopped;
// the test's cleanup waits for Run to return, whatever it returns.
func (s *Stack) AddKillableCoordinator(mod ...func(*coordinator.Config)) (c *coordinator.Coordinator, kill func()) {
	s.T.Helper()
	nc := s.Conn()
	cfg := coordinator.Config{NC: nc, Store: s.storeOn(nc), HeartbeatInterval: Heartbeat, HostExpiry: HostExpiry, Logger: testutil.Logger(s.T)}
	for _, m := range mod {
		m(&cfg)
	}
	c, err := coordinator.New(cfg)
	if err != nil {
		s.T.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	var once sync.Once
	kill = func() {
		once.Do(func() {
			cid, cidErr := nc.GetClientID()
			nc.Close()
			cancel()
			if s.Server == nil || cidErr != nil {
				return
			}
			// Once kill returns, the server routes no request to the
			// killed replica's subscriptions (a request sent while it
			// still knew them would go unanswered).
			testutil.Eventually(s.T, 10*time.Second, func() bool {
				cz, err := s.Server.Server().Connz(&server.ConnzOptions{CID: cid})
				return err == nil && len(cz.Conns) == 0
			}, "the server drops the killed coordinator's connection")
		})
	}
	s.T.Cleanup(func() {
		kill()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			s.T.Errorf("killed coordinator %s did not return within 60s", c.ID())
		}
	})
	select {
	case <-c.Ready():
	case <-time.After(10 * time.Second):
		s.T.Fatal("coordinator not serving after 10s")
	}
	return c, kill
}

// AddSpawnWorker starts a spawn worker with the scripted model on its own
// connection; its descriptor names the scripted model, as `brood
// spawn-worker --model scripted`'s does.
func (s *Stack) AddSpawnWorker(mod ...func(*worker.InProcessConfig)) (*worker.Host, func()) {
	s.T.Helper()
	desc := spawnworker.Descriptor(spawnworker.DefaultName)
	desc.Models = []protocol.ModelInfo{model.ScriptedInfo}
	return s.AddInProcessWorker(desc, mod...)
}

// AddForkWorker starts a fork worker with the scripted model on its own
// connection, its descriptor naming it (as AddSpawnWorker's).
func (s *Stack) AddForkWorker(mod ...func(*worker.InProcessConfig)) (*worker.Host, func()) {
	s.T.Helper()
	desc := forkworker.Descriptor(forkworker.DefaultName)
	desc.Models = []protocol.ModelInfo{model.ScriptedInfo}
	return s.AddInProcessWorker(desc, mod...)
}

// AddInProcessWorker starts a worker of an in-process provider.
func (s *Stack) AddInProcessWorker(desc protocol.ProviderDescriptor, mod ...func(*worker.InProcessConfig)) (*worker.Host, func()) {
	s.T.Helper()
	nc := s.Conn()
	cfg := worker.InProcessConfig{
		NC: nc, Store: s.storeOn(nc), Models: func() (model.Model, error) { return model.NewScripted(), nil },
		HeartbeatInterval: Heartbeat, HostExpiry: HostExpiry, DrainGrace: 2 * time.Second, Logger: testutil.Logger(s.T),
		// Tests' workspaces are temporary directories anywhere: a stack's
		// workers allow any, as `brood dev` does.
		WorkspaceRoots: []string{agent.AnyWorkspace},
	}
	for _, m := range mod {
		m(&cfg)
	}
	name := desc.Name
	if cfg.Name != "" {
		name = cfg.Name
	}
	s.Provide(name)
	w, err := worker.NewInProcessHost(cfg, desc)
	if err != nil {
		s.T.Fatal(err)
	}
	stop := testutil.Background(s.T, w)
	s.WaitProvider(name)
	return w, stop
}

// AddHost starts a worker host serving the given providers (provisioned
// first: Provide).
func (s *Stack) AddHost(providers ...worker.Provider) *worker.Host {
	s.T.Helper()
	for _, p := range providers {
		s.Provide(p.Descriptor().Name)
	}
	nc := s.Conn()
	h, err := worker.New(worker.Config{
		NC: nc, Store: s.storeOn(nc), Providers: providers,
		HeartbeatInterval: Heartbeat, HostExpiry: HostExpiry, DrainGrace: 2 * time.Second, Logger: testutil.Logger(s.T),
	})
	if err != nil {
		s.T.Fatal(err)
	}
	testutil.Background(s.T, h)
	for _, p := range providers {
		s.WaitProvider(p.Descriptor().Name)
	}
	return h
}

// Provide provisions the log and inbox streams of providers (the admin
// step before a new provider's workers start, `brood provision
// --providers`); those of store.DefaultProviders are there from the start.
// A name that is no valid provider is left to the worker to refuse.
func (s *Stack) Provide(providers ...string) {
	s.T.Helper()
	var add []string
	for _, p := range providers {
		if !slices.Contains(s.Store.Cfg.Providers, p) && store.CheckProviders([]string{p}) == nil {
			add = append(add, p)
		}
	}
	if len(add) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := s.Store.Cfg
	cfg.Providers = append(slices.Clone(cfg.Providers), add...)
	if _, err := store.Provision(ctx, s.NC, s.Store.Subj, cfg); err != nil {
		s.T.Fatalf("provision providers %v: %v", add, err)
	}
	s.Store.Cfg.Providers = cfg.Providers
}

func (s *Stack) storeOn(nc *nats.Conn) *store.Store {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := store.Bind(ctx, nc, s.Store.Subj)
	if err != nil {
		s.T.Fatal(err)
	}
	st.Cfg = s.Store.Cfg
	return st
}

// WaitProvider waits until a coordinator lists provider name ("" = spawn).
func (s *Stack) WaitProvider(name string) {
	s.T.Helper()
	if name == "" {
		name = spawnworker.DefaultName
	}
	testutil.Eventually(s.T, 10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err := s.Client.Providers(ctx)
		return err == nil && r.Instances[name] > 0
	}, "provider %s listed", name)
}

// Root opens a root agent in a temp dir (or dir, when given), closed at cleanup.
func (s *Stack) Root(dir ...string) *client.Root {
	s.T.Helper()
	cwd := ""
	if len(dir) > 0 {
		cwd = dir[0]
	} else if tb, ok := s.T.(interface{ TempDir() string }); ok {
		cwd = tb.TempDir()
	} else {
		cwd, _ = os.Getwd()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: cwd})
	if err != nil {
		s.T.Fatalf("open root: %v", err)
	}
	s.T.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = r.Close(ctx)
	})
	return r
}

// Run starts a one-shot run of parent on provider and waits for its result.
func (s *Stack) Run(parent protocol.ParentRef, provider, prompt string, opts protocol.StartOptions) (*client.Run, protocol.SubagentResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Provider: provider, Parent: parent, Prompt: protocol.Text(prompt), Options: opts})
	if err != nil {
		return nil, protocol.SubagentResult{}, err
	}
	res, err := run.Result(ctx)
	return run, res, err
}

// Log reads a session's header and events through the coordinator, with a
// user grant.
func (s *Stack) Log(id string) (protocol.SessionHeader, []protocol.SessionEvent) {
	s.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := s.Client.Log(ctx, protocol.LogReadRequest{SessionID: id, Authority: s.Grant()})
	if err != nil {
		s.T.Fatalf("log %s: %v", id, err)
	}
	return l.Header, l.Events
}

// Grant mints a user grant (once per stack) and returns it as an Authority.
func (s *Stack) Grant() protocol.Authority {
	s.T.Helper()
	s.grantMu.Lock()
	defer s.grantMu.Unlock()
	if s.grant == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		g, err := s.Client.UserGrant(ctx)
		if err != nil {
			s.T.Fatalf("user grant: %v", err)
		}
		s.grant = g.Grant
	}
	return protocol.Authority{Grant: s.grant}
}

// SessionCount is the number of session headers ever written.
func (s *Stack) SessionCount() uint64 {
	s.T.Helper()
	info, err := s.Store.Sessions.Info(context.Background())
	if err != nil {
		s.T.Fatal(err)
	}
	return info.State.Msgs
}

// Lifecycle reads every lifecycle event under parent ("*" for all), in order.
func (s *Stack) Lifecycle(parent string) []protocol.LifecycleEvent {
	s.T.Helper()
	ctx := context.Background()
	cons, err := s.Store.Events.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{s.Store.Subj.EventsAll(parent)}})
	if err != nil {
		s.T.Fatal(err)
	}
	var out []protocol.LifecycleEvent
	for {
		batch, err := cons.FetchNoWait(500)
		if err != nil {
			s.T.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			var ev protocol.LifecycleEvent
			if err := protocol.Unmarshal(protocol.Msgpack, m.Data(), &ev); err != nil {
				s.T.Fatal(err)
			}
			out = append(out, ev)
			n++
		}
		if n == 0 {
			return out
		}
	}
}

// Ends counts the subagent/end events of run runID among parent's lifecycle
// events (exactly one when the run was settled once).
func (s *Stack) Ends(parent, runID string) int {
	s.T.Helper()
	n := 0
	for _, ev := range s.Lifecycle(parent) {
		if ev.Type == protocol.LifecycleEnd && ev.RunID == runID {
			n++
		}
	}
	return n
}
