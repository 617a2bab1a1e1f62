package deploy

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/chaos"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	acpbridge "github.com/brood-dev/brood/services/acp-bridge"
	"github.com/brood-dev/brood/services/coordinator"
	forkworker "github.com/brood-dev/brood/services/fork-worker"
	spawnworker "github.com/brood-dev/brood/services/spawn-worker"
)

// Sites (issue 36; deploy/README.md, "Sites"): a leaf node of its own, in
// its own account and JetStream domain, joins the 3-node hub of
// nats/cluster, whose domain is hub; the site's workers connect to the
// leaf node only.

const (
	// siteConf is the leaf node of the example site.
	siteConf = siteDir + "/site1.conf"
	// hubDomain is the JetStream domain of the hub (nats/cluster/node-*.conf).
	hubDomain = "hub"
)

// siteProviders are the providers the example site hosts, each on its own
// link (a local account and a remote of site1.conf, an nkey user of
// accounts.conf).
var siteProviders = []string{"spawn", "fork", "acp"}

// placeholderKeys are the public keys accounts.conf ships for the site's
// links: generated for the file, their seeds thrown away.
var placeholderKeys = map[string]string{
	"spawn": "UBHR3QEZRTJV5JMPEYLODH4M5MTIZTA55WTA3RNB3PP23YDWKVHNHLUL",
	"fork":  "UAH3M5KJLXVYUL5F7X5VBEVCTVYS55AV2FAEI2U3AVCQVSQ3KATQO7EN",
	"acp":   "UD6VHGAQLIKM5WFU5DYKAPH4IRRO732YHASASDFCMF52DSKFWFG5MB32",
}

// siteKeyPair is the nkey of one of the test site's links.
type siteKeyPair struct {
	pub  string
	seed []byte
}

var (
	siteKeysOnce sync.Once
	siteKeys     map[string]siteKeyPair
	siteKeysErr  error
)

// siteKey is the test's key of provider p's link, made once per process.
func siteKey(t testing.TB, p string) siteKeyPair {
	t.Helper()
	siteKeysOnce.Do(func() {
		siteKeys = map[string]siteKeyPair{}
		for _, p := range siteProviders {
			kp, err := nkeys.CreateUser()
			if err != nil {
				siteKeysErr = err
				return
			}
			pub, _ := kp.PublicKey()
			seed, _ := kp.Seed()
			siteKeys[p] = siteKeyPair{pub: pub, seed: seed}
		}
	})
	if siteKeysErr != nil {
		t.Fatal(siteKeysErr)
	}
	return siteKeys[p]
}

// siteSeedEnv is the variable site1.conf reads provider p's link seed from.
func siteSeedEnv(p string) string { return "BROOD_SITE_" + strings.ToUpper(p) + "_SEED" }

// checkSite checks what a site's leaf node must state: JetStream in a
// domain of its own (never the hub's, whose API requests would then stay
// on the site), one local account per remote, each bound with an nkey and
// holding users of its provider's worker only, each with exactly that
// worker role's subscribe permissions (the queue groups the hub cannot
// check on the link).
func checkSite(t *testing.T, o *server.Options) {
	t.Helper()
	if o.JetStreamDomain == "" || o.JetStreamDomain == hubDomain {
		t.Errorf("a site's JetStream domain is %q: it needs one of its own, not the hub's %q", o.JetStreamDomain, hubDomain)
	}
	if len(o.LeafNode.Remotes) == 0 {
		t.Fatal("a site without leafnode remotes")
	}
	roles := workerRoles(t)
	bound := map[string]bool{}
	for _, r := range o.LeafNode.Remotes {
		if r.Nkey == "" {
			t.Errorf("remote of account %s: no nkey (a site's links authenticate with the site's own seeds)", r.LocalAccount)
		}
		if r.LocalAccount == "" || bound[r.LocalAccount] {
			t.Errorf("remote of account %q: every link binds an account of its own", r.LocalAccount)
		}
		bound[r.LocalAccount] = true
	}
	for _, u := range o.Users {
		if u.Account == nil || !bound[u.Account.Name] {
			t.Errorf("user %s is in no account bound to a link", u.Username)
			continue
		}
		if want := "worker-" + strings.ToLower(u.Account.Name); u.Username != want {
			t.Errorf("user %s in account %s: a site's account holds its provider's worker (%s) only", u.Username, u.Account.Name, want)
			continue
		}
		role := roles[u.Username]
		if role == nil || u.Permissions == nil || u.Permissions.Subscribe == nil ||
			!slices.Equal(u.Permissions.Subscribe.Allow, role.Permissions.Subscribe.Allow) || len(u.Permissions.Subscribe.Deny) > 0 {
			t.Errorf("user %s: its subscribe permissions are not its worker role's", u.Username)
		}
	}
}

// throughDomain is a worker role's permission as a link's user carries it
// (accounts.conf, "Sites"): every JetStream API subject in the hub's
// domain, a KV write through the domain's API ($KV.X is $JS.hub.API.$KV.X),
// a subscription without its queue group (nats-server checks what crosses
// a leaf link by subject only: a queue-qualified entry would let nothing
// through; the site's own server holds its users to the queue group,
// checkSite), and, with publish set, a Brood subject's trailing * tokens
// as > (nats-server's reverse match misses a hub subscription wider than
// an entry ending in *, so the link would never learn of it).
func throughDomain(subjects []string, publish bool) []string {
	var out []string
	for _, s := range subjects {
		switch {
		case strings.HasPrefix(s, "$JS.API."):
			s = store.APIPrefix(hubDomain) + strings.TrimPrefix(s, "$JS.API.")
		case strings.HasPrefix(s, "$KV."):
			s = store.APIPrefix(hubDomain) + s
		case publish && strings.HasPrefix(s, "brood.") && strings.HasSuffix(s, ".*"):
			for strings.HasSuffix(s, ".*") {
				s = strings.TrimSuffix(s, ".*")
			}
			s += ".>"
		}
		s, _, _ = strings.Cut(s, " ")
		out = append(out, s)
	}
	return out
}

// workerRoles are the worker users of nats/cluster/accounts.conf by name.
func workerRoles(t *testing.T) map[string]*server.User {
	t.Helper()
	o := processConf(t, clusterDir+"/accounts.conf")
	out := map[string]*server.User{}
	for _, u := range o.Users {
		if strings.HasPrefix(u.Username, "worker-") {
			out[u.Username] = u
		}
	}
	return out
}

// TestSiteLinksHoldExactlyTheWorkerRoles: each link user of the example
// site in accounts.conf is in account BROOD with exactly its provider's
// worker role, rewritten into the hub's domain, subject for subject, and
// nothing else (issue 36, item 2: nothing more crosses the link).
func TestSiteLinksHoldExactlyTheWorkerRoles(t *testing.T) {
	setPasswords(t)
	o := processConf(t, clusterDir+"/node-1.conf")
	checkSite(t, processConf(t, siteConf))
	if o.JetStreamDomain != hubDomain {
		t.Fatalf("the hub's JetStream domain is %q, want %q", o.JetStreamDomain, hubDomain)
	}
	byName := map[string]*server.User{}
	for _, u := range o.Users {
		byName[u.Username] = u
	}
	byKey := map[string]*server.NkeyUser{}
	for _, u := range o.Nkeys {
		byKey[u.Nkey] = u
	}
	if len(byKey) != len(placeholderKeys) {
		t.Errorf("%d nkey users, want the site's %d links", len(byKey), len(placeholderKeys))
	}
	for _, p := range siteProviders {
		link, role := byKey[placeholderKeys[p]], byName["worker-"+p]
		if link == nil || role == nil {
			t.Fatalf("%s: link user %v, worker user %v", p, link, role)
		}
		if link.Account == nil || link.Account.Name != "BROOD" {
			t.Errorf("%s: the link's user is not in account BROOD", p)
		}
		rp, lp := role.Permissions, link.Permissions
		for _, c := range []struct {
			what      string
			role, got []string
			publish   bool
		}{
			{"publish allow", rp.Publish.Allow, lp.Publish.Allow, true},
			{"publish deny", rp.Publish.Deny, lp.Publish.Deny, false},
			{"subscribe allow", rp.Subscribe.Allow, lp.Subscribe.Allow, false},
			{"subscribe deny", rp.Subscribe.Deny, lp.Subscribe.Deny, false},
		} {
			if want := throughDomain(c.role, c.publish); !slices.Equal(c.got, want) {
				t.Errorf("%s: the link's %s is\n%v\nwant the worker's through the domain\n%v", p, c.what, c.got, want)
			}
		}
		if (rp.Response == nil) != (lp.Response == nil) || rp.Response != nil && *rp.Response != *lp.Response {
			t.Errorf("%s: allow_responses %+v, the worker's %+v", p, lp.Response, rp.Response)
		}
	}
}

// site is the hub of nats/cluster with the example site's leaf node
// joined to it through proxies (one per hub node), so a test can cut or
// slow the link.
type site struct {
	hub     []*server.Server
	hubURLs string
	leaf    *server.Server
	proxies []*chaos.Proxy
}

// startSite starts the hub from a copy of nats/cluster whose placeholder
// keys are the test's, and the site from nats/site/site1.conf, its remotes
// through proxies.
func startSite(t *testing.T) *site {
	t.Helper()
	// Registered first, so it runs last: once the services and servers
	// are stopped, a publish they made off their callers' path (a
	// lifecycle event after the site's return) gives up within
	// store.AsyncBudget; the package's goleak check must not see it.
	t.Cleanup(func() {
		waitFor(t, store.AsyncBudget+store.AckWaitMax+5*time.Second, "the stores' publishes off the callers' path to end", func() bool {
			buf := make([]byte, 1<<20)
			return !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "store.(*Store).publishAsync")
		})
	})
	setPasswords(t)
	dir := t.TempDir()
	for _, f := range []string{"accounts.conf", "node-1.conf", "node-2.conf", "node-3.conf"} {
		data, err := os.ReadFile(filepath.Join(clusterDir, f))
		if err != nil {
			t.Fatal(err)
		}
		text := string(data)
		for _, p := range siteProviders {
			text = strings.ReplaceAll(text, placeholderKeys[p], siteKey(t, p).pub)
		}
		if err := os.WriteFile(filepath.Join(dir, f), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var opts []*server.Options
	for i := 1; i <= 3; i++ {
		o := processConf(t, filepath.Join(dir, fmt.Sprintf("node-%d.conf", i)))
		// The hub must not tell the site its leafnode URLs: the site would
		// reconnect to them around the proxies that cut its links.
		o.LeafNode.NoAdvertise = true
		opts = append(opts, o)
	}
	s := &site{hub: startServers(t, opts...)}
	waitMetaLeader(t, s.hub)
	var urls []string
	for _, h := range s.hub {
		urls = append(urls, h.ClientURL())
	}
	s.hubURLs = strings.Join(urls, ",")
	var leafURLs []*url.URL
	for i, o := range opts {
		p, err := chaos.NewProxy(fmt.Sprintf("leaf-link-%d", i+1), fmt.Sprintf("127.0.0.1:%d", o.LeafNode.Port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		s.proxies = append(s.proxies, p)
		leafURLs = append(leafURLs, &url.URL{Scheme: "nats-leaf", Host: p.Addr()})
	}

	lo := processConf(t, siteConf)
	lo.Port, lo.HTTPPort, lo.StoreDir, lo.NoSigs, lo.NoLog = -1, 0, t.TempDir(), true, true
	for _, r := range lo.LeafNode.Remotes {
		r.URLs = leafURLs
	}
	leaf, err := server.NewServer(lo)
	if err != nil {
		t.Fatal(err)
	}
	go leaf.Start()
	t.Cleanup(func() { leaf.Shutdown(); leaf.WaitForShutdown() })
	if !leaf.ReadyForConnections(10 * time.Second) {
		t.Fatal("the site's leaf node is not accepting clients")
	}
	s.leaf = leaf
	s.waitLinks(t, 20*time.Second)
	return s
}

// waitLinks waits until every link of the site is up.
func (s *site) waitLinks(t *testing.T, d time.Duration) {
	t.Helper()
	waitFor(t, d, "the site's links up", func() bool { return s.leaf.NumLeafNodes() == len(siteProviders) })
}

// setLink cuts, drops or heals every link of the site.
func (s *site) setLink(mode chaos.LinkMode) {
	for _, p := range s.proxies {
		p.Set(mode, 0)
	}
}

// siteConn connects to the site's leaf node as the site's local worker of
// provider p, with that worker role's inbox prefix.
func (s *site) siteConn(t *testing.T, p string, v *violations) *nats.Conn {
	t.Helper()
	return s.siteConnInbox(t, p, protocol.UserInboxPrefix("worker-"+p), v)
}

// siteConnInbox is siteConn with inbox prefix inbox (under the role's).
func (s *site) siteConnInbox(t *testing.T, p, inbox string, v *violations) *nats.Conn {
	t.Helper()
	user := "worker-" + p
	nc, err := nats.Connect(s.leaf.ClientURL(), nats.UserInfo(user, passwordOf(t, "site-"+user)), nats.Name("site-test-"+user),
		nats.CustomInboxPrefix(inbox), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.ErrorHandler(v.handler))
	if err != nil {
		t.Fatalf("connect to the site as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Timing of the site test: the production default host expiry, so a 2 s
// cut stays well under it on a loaded machine.
const (
	siteHeartbeat  = 500 * time.Millisecond
	siteHostExpiry = protocol.DefaultHostExpiry
)

// acpFake builds the scripted ACP agent of the integration tests.
func acpFake(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "acpfake")
	if out, err := exec.Command("go", "build", "-o", bin, "../integration/acpfake").CombinedOutput(); err != nil {
		t.Fatalf("build the fake ACP agent: %v\n%s", err, out)
	}
	return bin
}

// siteWorkers starts a spawn worker, a fork worker and an ACP bridge
// connected to the site's leaf node only, each as the site's local worker
// of its provider with the hub's JetStream domain; it returns their host ids.
func (s *site) siteWorkers(t *testing.T, v *violations) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	open := func(nc *nats.Conn, p string) *store.Store {
		cfg := store.DefaultConfig()
		cfg.Replicas, cfg.Providers, cfg.SkipRoots, cfg.JSDomain = 3, []string{p}, true, hubDomain
		st, err := store.Open(ctx, nc, protocol.MustSubjects(""), cfg)
		if err != nil {
			t.Fatalf("open the store through the site as worker-%s: %v", p, err)
		}
		return st
	}
	models := func() (model.Model, error) { return model.NewScripted(), nil }
	hosts := map[string]string{}
	nc := s.siteConn(t, "spawn", v)
	w, err := spawnworker.New(spawnworker.Config{NC: nc, Store: open(nc, "spawn"), Models: models,
		HeartbeatInterval: siteHeartbeat, HostExpiry: siteHostExpiry, DrainGrace: 2 * time.Second, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Background(t, w)
	hosts["spawn"] = w.ID()
	nc = s.siteConn(t, "fork", v)
	fw, err := forkworker.New(forkworker.Config{NC: nc, Store: open(nc, "fork"), Models: models,
		HeartbeatInterval: siteHeartbeat, HostExpiry: siteHostExpiry, DrainGrace: 2 * time.Second, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Background(t, fw)
	hosts["fork"] = fw.ID()
	nc = s.siteConn(t, "acp", v)
	b, err := acpbridge.New(acpbridge.Config{NC: nc, Store: open(nc, "acp"),
		Agents:            []acpbridge.AgentConfig{{Name: "acp", Command: acpFake(t)}},
		Options:           acpbridge.Options{SilenceTimeout: 30 * time.Second, EOFGrace: 300 * time.Millisecond, TermGrace: 300 * time.Millisecond},
		HeartbeatInterval: siteHeartbeat, HostExpiry: siteHostExpiry, DrainGrace: 2 * time.Second, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Background(t, b)
	hosts["acp"] = b.HostID()
	return hosts
}

// TestASiteServesThroughALeafNode (issue 36, acceptance): the 3-node hub of
// nats/cluster (domain hub) and the example site's leaf node (its own
// accounts and domain site1); a spawn worker, a fork worker and an ACP
// bridge connected only to the leaf node, as the site's local users, with
// --js-domain hub; a coordinator and a client on the hub. One-shot and
// continuable runs, followups, an interrupt, a drain and a fork complete
// with no permission violation; cutting the links for 2 s (under the host
// expiry) loses no run; cutting them for longer than the host expiry lets
// the coordinators settle the site's run HOST_LOST, and once the links
// return the site's late writes are fenced: one settlement, one turn end,
// and the history checker's invariants hold over the whole test.
func TestASiteServesThroughALeafNode(t *testing.T) {
	s := startSite(t)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	subj := protocol.MustSubjects("")
	cfg := store.DefaultConfig()
	cfg.Replicas = 3
	v := &violations{}
	if _, err := store.Provision(ctx, connectAs(t, s.hubURLs, "admin", v), subj, cfg); err != nil {
		t.Fatalf("provision: %v", err)
	}
	coordNC := serviceConn(t, s.hubURLs, "coordinator", v)
	coordStore, err := store.Open(ctx, coordNC, subj, openConfig(coordNC, cfg))
	if err != nil {
		t.Fatal(err)
	}
	// The site's spawn worker is the only one: a run it loses to a cut waits
	// ContinueWaitMax for an instance to continue it (none comes while the
	// links are cut), then ends HOST_LOST.
	coord, err := coordinator.New(coordinator.Config{NC: coordNC, Store: coordStore,
		HeartbeatInterval: siteHeartbeat, HostExpiry: siteHostExpiry, ContinueWaitMax: time.Second, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Background(t, coord)
	<-coord.Ready()
	hosts := s.siteWorkers(t, v)
	cl, err := client.New(serviceConn(t, s.hubURLs, "client", v), client.Options{AwaitFallback: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	waitFor(t, 30*time.Second, "spawn, fork and acp listed", func() bool {
		r, err := cl.Providers(ctx)
		return err == nil && r.Instances["spawn"] > 0 && r.Instances["fork"] > 0 && r.Instances["acp"] > 0
	})
	root, err := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = root.Close(context.Background()) })
	h := &siteHistory{t: t, cl: cl, root: root, st: coordStore}

	t.Run("one-shot runs on every provider", func(t *testing.T) {
		for _, c := range []struct{ provider, prompt, want string }{
			{"spawn", "say spawned at the site", "spawned at the site"},
			{"acp", "echo hi", "echo: hi"},
			{"fork", "say forked at the site", "forked at the site"},
		} {
			res, settledBy := h.run(ctx, c.provider, c.prompt)
			if res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != c.want {
				t.Errorf("%s: %+v", c.provider, res)
			}
			if settledBy != hosts[c.provider] {
				t.Errorf("%s: settled by %q, want the site's host %q", c.provider, settledBy, hosts[c.provider])
			}
		}
	})

	t.Run("continuable, followups, an interrupt and a drain", func(t *testing.T) {
		c := h.start(ctx, "spawn", "say first")
		h.waitAnswers(ctx, c, 1)
		h.followup(ctx, c, "say second")
		h.waitAnswers(ctx, c, 2)
		// An ACP child's turn (the scripted agent does not restore a
		// session, so its followups are the ACP tests' of integration/).
		a := h.start(ctx, "acp", "echo first")
		h.waitAnswers(ctx, a, 1)
		i := h.start(ctx, "spawn", "sleep 30s\nsay never")
		h.waitState(ctx, i, protocol.StateRunning)
		o := h.op(&chaos.Op{Kind: chaos.OpInterrupt, Child: i})
		r, err := cl.Interrupt(ctx, protocol.InterruptRequest{ChildID: i, Authority: root.Authority()})
		h.complete(o, err)
		if err != nil || !r.Interrupted {
			t.Fatalf("interrupt: %+v, %v", r, err)
		}
		h.waitTurnEnds(ctx, i, 1)
		d := h.start(ctx, "spawn", "sleep 30s\nsay never")
		h.waitState(ctx, d, protocol.StateRunning)
		p := root.Ref()
		o = h.op(&chaos.Op{Kind: chaos.OpDrain, Scope: "children", Targets: []string{d}})
		dr, err := cl.Drain(ctx, protocol.DrainRequest{Authority: protocol.Authority{Parent: &p}, Parent: root.SessionID, Children: []string{d}})
		h.complete(o, err)
		if err != nil || len(dr.Disposed) != 1 || dr.Disposed[0] != d {
			t.Fatalf("drain: %+v, %v", dr, err)
		}
		h.waitState(ctx, d, protocol.StateNone)
	})

	t.Run("a 2 s cut of the links costs no run", func(t *testing.T) {
		done := h.runAsync(ctx, "spawn", "sleep 3s\nsay survived the cut")
		c := h.start(ctx, "spawn", "sleep 3s\nsay continued through the cut")
		h.waitState(ctx, c, protocol.StateRunning)
		h.fault("cut", func() {
			s.setLink(chaos.Cut)
			time.Sleep(2 * time.Second) // the fault's length, not a wait for a condition
			s.setLink(chaos.Pass)
		})
		s.waitLinks(t, 20*time.Second)
		r := <-done
		if r.err != nil || r.res.StopReason != protocol.StopCompleted || protocol.PlainText(r.res.Output) != "survived the cut" {
			t.Fatalf("the run across the cut: %+v, %v", r.res, r.err)
		}
		if r.settledBy != hosts["spawn"] {
			t.Fatalf("the run across the cut was settled by %q, not the site's host %q: it was taken over", r.settledBy, hosts["spawn"])
		}
		h.waitAnswers(ctx, c, 1)
	})

	t.Run("a cut longer than the host expiry: taken over, late writes fenced", func(t *testing.T) {
		done := h.runAsync(ctx, "spawn", "sleep 3s\nsay too late")
		h.waitRunClaimed(ctx)
		var r runOutcome
		h.fault("cut", func() {
			s.setLink(chaos.Cut)
			r = <-done // settled by a coordinator while the site is away
			s.setLink(chaos.Pass)
		})
		if r.err != nil || r.res.ErrorCode != protocol.CodeHostLost {
			t.Fatalf("the run of the cut-off site: %+v, %v; want HOST_LOST", r.res, r.err)
		}
		if r.settledBy == hosts["spawn"] {
			t.Fatalf("the run was settled by the cut-off site's host")
		}
		s.waitLinks(t, 20*time.Second)
		// The site's worker finishes its turn after its return (its sleep
		// ends within the cut): its appends and its settlement are fenced,
		// and it serves new runs again once it heartbeats.
		waitFor(t, 30*time.Second, "the site's spawn host live again", func() bool {
			recs, err := coordStore.HostRecords(ctx)
			for _, rec := range recs {
				if err == nil && rec.HostID == hosts["spawn"] && time.Since(time.UnixMilli(rec.Heartbeat)) < siteHostExpiry/2 {
					return true
				}
			}
			return false
		})
		res, settledBy := h.run(ctx, "spawn", "say back")
		if protocol.PlainText(res.Output) != "back" || settledBy != hosts["spawn"] {
			t.Fatalf("after the site's return: %+v by %q", res, settledBy)
		}
		rec, err := coordStore.RunLatestOf(ctx, "spawn", r.runID)
		if err != nil || rec.Value.State != protocol.RunSettled || rec.Value.Result == nil || rec.Value.Result.ErrorCode != protocol.CodeHostLost {
			t.Fatalf("the taken-over run's record after the site's return: %+v, %v", rec.Value, err)
		}
		_, evs := h.log(ctx, r.childID)
		ends := 0
		for _, ev := range evs {
			if ev.Type == protocol.EvTurnEnd {
				ends++
			}
			if ev.Type == protocol.EvAssistantMessage {
				var d protocol.AssistantMessageData
				_ = ev.Decode(&d)
				if strings.Contains(protocol.PlainText(d.Message.Content), "too late") {
					t.Fatalf("the cut-off site's late answer reached the log: %v", evs)
				}
			}
		}
		if ends != 1 {
			t.Fatalf("%d turn ends in the taken-over run's log, want 1: %v", ends, evs)
		}
	})

	h.check(ctx, s)
	if vs := v.list(); len(vs) > 0 {
		t.Fatalf("permission violations while the services ran as their users:\n%s", strings.Join(vs, "\n"))
	}
}

// runOutcome is a one-shot run's end as the client saw it.
type runOutcome struct {
	runID, childID string
	res            protocol.SubagentResult
	settledBy      string
	err            error
}

// siteHistory drives the site test's client and records what it did, as
// the chaos workload records it, for the history checker.
type siteHistory struct {
	t    *testing.T
	cl   *client.Client
	root *client.Root
	// st reads the run records (a coordinator's store).
	st *store.Store

	mu     sync.Mutex
	ops    []*chaos.Op
	faults []chaos.FaultRecord
	began  int64
}

func (h *siteHistory) op(o *chaos.Op) *chaos.Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.began == 0 {
		h.began = store.NowMs()
	}
	o.ID, o.Client, o.Sender, o.Root, o.Parent = int64(len(h.ops)+1), "site-test", h.root.SessionID, h.root.SessionID, h.root.SessionID
	o.Invoke = store.NowMs()
	h.ops = append(h.ops, o)
	return o
}

// complete records op's outcome.
func (h *siteHistory) complete(o *chaos.Op, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	o.Complete, o.Outcome = store.NowMs(), chaos.OutcomeOK
	if err != nil {
		o.Outcome, o.Error = chaos.OutcomeFail, err.Error()
	}
}

// fault runs f as a fault of class on the site's links, recorded.
func (h *siteHistory) fault(class string, f func()) {
	start := store.NowMs()
	f()
	h.mu.Lock()
	h.faults = append(h.faults, chaos.FaultRecord{Class: class, Target: "site links", Start: start, End: store.NowMs()})
	h.mu.Unlock()
}

// runAsync starts a one-shot run and reports its end.
func (h *siteHistory) runAsync(ctx context.Context, provider, prompt string) <-chan runOutcome {
	out := make(chan runOutcome, 1)
	o := h.op(&chaos.Op{Kind: chaos.OpRun, Script: prompt})
	run, err := h.cl.StartRun(ctx, protocol.RunStartRequest{Parent: h.root.Ref(), Provider: provider, Prompt: protocol.Text(prompt)})
	if err != nil {
		o.Complete, o.Outcome, o.Error = store.NowMs(), chaos.OutcomeFail, err.Error()
		h.t.Fatalf("start %q on %s: %v", prompt, provider, err)
	}
	o.RunID, o.Child = run.RunID, run.ChildID
	go func() {
		res, err := run.Result(ctx)
		r := runOutcome{runID: run.RunID, childID: run.ChildID, res: res, err: err}
		h.mu.Lock()
		o.Complete, o.Outcome = store.NowMs(), chaos.OutcomeOK
		o.ResultAt, o.StopReason, o.ResultCode = o.Complete, string(res.StopReason), string(res.ErrorCode)
		o.Notices = append(o.Notices, chaos.Notice{At: o.Complete, StopReason: string(res.StopReason), ErrorCode: string(res.ErrorCode)})
		h.mu.Unlock()
		if err == nil {
			rec, rerr := h.st.RunLatestOf(ctx, provider, run.RunID)
			r.settledBy, r.err = rec.Value.SettledBy, rerr
		}
		out <- r
	}()
	return out
}

// run starts a one-shot run and waits for its result and who settled it.
func (h *siteHistory) run(ctx context.Context, provider, prompt string) (protocol.SubagentResult, string) {
	r := <-h.runAsync(ctx, provider, prompt)
	if r.err != nil {
		h.t.Fatalf("%q on %s: %v", prompt, provider, r.err)
	}
	return r.res, r.settledBy
}

// start starts a continuable child and returns its id.
func (h *siteHistory) start(ctx context.Context, provider, prompt string) string {
	o := h.op(&chaos.Op{Kind: chaos.OpStart, Script: prompt})
	r, err := h.cl.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: provider, Parent: h.root.Ref(), Label: "site", Prompt: protocol.Text(prompt)})
	o.Complete = store.NowMs()
	if err != nil {
		o.Outcome, o.Error = chaos.OutcomeFail, err.Error()
		h.t.Fatalf("continuable.start on %s: %v", provider, err)
	}
	o.Outcome, o.Child, o.MessageID = chaos.OutcomeOK, r.ChildID, r.MessageID
	return r.ChildID
}

// followup sends text to child.
func (h *siteHistory) followup(ctx context.Context, child, text string) {
	o := h.op(&chaos.Op{Kind: chaos.OpFollowup, Child: child, Script: text})
	r, err := h.cl.Followup(ctx, protocol.FollowupRequest{ChildID: child, Authority: h.root.Authority(), Message: protocol.Text(text)})
	o.Complete = store.NowMs()
	if err != nil {
		o.Outcome, o.Error = chaos.OutcomeFail, err.Error()
		h.t.Fatalf("followup: %v", err)
	}
	o.Outcome, o.MessageID = chaos.OutcomeOK, r.MessageID
}

func (h *siteHistory) log(ctx context.Context, child string) (protocol.SessionHeader, []protocol.SessionEvent) {
	l, err := h.cl.Log(ctx, protocol.LogReadRequest{SessionID: child, Authority: h.root.Authority()})
	if err != nil {
		h.t.Fatalf("log of %s: %v", child, err)
	}
	return l.Header, l.Events
}

func (h *siteHistory) count(ctx context.Context, child, typ string) int {
	_, evs := h.log(ctx, child)
	n := 0
	for _, ev := range evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

func (h *siteHistory) waitAnswers(ctx context.Context, child string, n int) {
	h.t.Helper()
	testutil.Eventually(h.t, 30*time.Second, func() bool { return h.count(ctx, child, protocol.EvTurnEnd) >= n },
		"%d turns of %s end", n, child)
}

func (h *siteHistory) waitTurnEnds(ctx context.Context, child string, n int) {
	h.waitAnswers(ctx, child, n)
}

func (h *siteHistory) waitState(ctx context.Context, child, want string) {
	h.t.Helper()
	testutil.Eventually(h.t, 30*time.Second, func() bool {
		st, err := h.cl.State(ctx, protocol.ChildRef{ChildID: child, Authority: h.root.Authority()})
		return err == nil && st.State == want
	}, "state of %s is %s", child, want)
}

// waitRunClaimed waits until the newest run is claimed by a host (its
// turn runs at the site).
func (h *siteHistory) waitRunClaimed(ctx context.Context) {
	h.t.Helper()
	h.mu.Lock()
	o := h.ops[len(h.ops)-1]
	h.mu.Unlock()
	testutil.Eventually(h.t, 30*time.Second, func() bool {
		rec, err := h.st.RunLatestOf(ctx, "spawn", o.RunID)
		return err == nil && rec.Value.HostID != ""
	}, "run %s claimed", o.RunID)
}

// check takes the snapshot of the hub's state and holds the history to the
// checker's invariants (shared/RELIABILITY.md).
func (h *siteHistory) check(ctx context.Context, s *site) {
	h.t.Helper()
	admin := connectAs(h.t, s.hubURLs, "admin", nil)
	var snap *chaos.Snapshot
	var err error
	// A snapshot's reads are retried as the chaos harness retries them
	// (a JetStream request can go unanswered on a loaded machine).
	testutil.Eventually(h.t, 60*time.Second, func() bool {
		snap, err = chaos.TakeSnapshot(ctx, admin, protocol.MustSubjects(""))
		if err != nil {
			h.t.Logf("snapshot: %v; again", err)
		}
		return err == nil
	}, "a snapshot of the hub")
	h.mu.Lock()
	hist := &chaos.History{
		Bounds: chaos.Bounds{HostExpiry: siteHostExpiry, Grace: 10 * time.Second, Cascade: 30 * time.Second, Process: 60 * time.Second},
		Limits: chaos.Limits{LiveChildrenMax: 64, DepthMax: 3}, Start: h.began, Healed: store.NowMs(),
		Ops: h.ops, Faults: h.faults, Snapshot: snap,
	}
	h.mu.Unlock()
	for _, v := range chaos.Check(hist).Verdicts {
		if v.Violations > 0 {
			h.t.Errorf("%s %s: %d violations: %v", v.Name, v.Title, v.Violations, v.Examples)
		}
	}
}

// TestForgeryThroughALeaf (issue 36, acceptance): the forgery suite's
// deployment (forgery.start: its coordinator, workers and victims on the
// hub of nats/cluster), and the suite's worker attempts made by the example
// site's local users through the site's leaf node, each refused with
// nothing changed. The site's accounts map the plain JetStream API and KV
// subjects the attempts use into the hub's domain, so each attempt crosses
// the link as a site's worker would send it; a refusal is the site's own
// server's (a permissions violation: its users hold the worker roles'
// subscribe permissions) or the hub's, which drops what the link's user may
// not carry: no answer at all.
func TestForgeryThroughALeaf(t *testing.T) {
	s := startSite(t)
	for _, name := range []string{"SPAWN", "FORK"} {
		acc, err := s.leaf.LookupAccount(name)
		if err != nil {
			t.Fatal(err)
		}
		for src, dst := range map[string]string{"$JS.API.>": store.APIPrefix(hubDomain) + ">", "$KV.>": store.APIPrefix(hubDomain) + "$KV.>"} {
			if err := acc.AddMapping(src, dst); err != nil {
				t.Fatal(err)
			}
		}
	}
	f := &forgery{t: t, all: s.hubURLs}
	for _, h := range s.hub {
		f.urls = append(f.urls, h.ClientURL())
	}
	f.start()
	// The victims' last writes (a settled run's spec given its TTL, a
	// lease released) land after start returns: wait until the stored
	// state holds still for a second, so each attempt's "nothing changed"
	// is the attempt's.
	prev, prevAt := f.snapshot(), time.Now()
	waitFor(t, 60*time.Second, "the stored state to hold still", func() bool {
		if time.Since(prevAt) < time.Second {
			return false
		}
		cur := f.snapshot()
		still := maps.EqualFunc(prev, cur, slices.Equal[[]string])
		prev, prevAt = cur, time.Now()
		return still
	})
	f.leaf = func(t *testing.T, user string) (*nats.Conn, func() int) {
		p, ok := strings.CutPrefix(user, "worker-")
		if !ok {
			t.Fatalf("no site user for %s", user)
		}
		// What the hub answers the site's user: every answer goes to the
		// attempt connection's own inbox prefix (under the role's, which
		// the same user on the hub may watch; the suite's own workers on
		// the hub use the role's prefix itself). The site's own "no
		// responders" (503, no body) never reaches the hub; the hub's are
		// not answers either.
		var n atomic.Int64
		inbox := protocol.UserInboxPrefix(user) + ".leafprobe"
		spy := connectAs(t, s.hubURLs, user, nil)
		if _, err := spy.Subscribe(inbox+".>", func(m *nats.Msg) {
			if len(m.Data) > 0 || m.Header.Get("Status") != "503" {
				n.Add(1)
			}
		}); err != nil {
			t.Fatal(err)
		}
		if err := spy.Flush(); err != nil {
			t.Fatal(err)
		}
		return s.siteConnInbox(t, p, inbox, &violations{}), func() int {
			_ = spy.Flush()
			return int(n.Load())
		}
	}
	t.Run("worker", f.workerAttempts)
	t.Run("worker of another provider", f.otherProviderAttempts)
	t.Run("worker reads across providers", f.crossProviderReads)
	t.Run("worker of the fork provider", f.forkWorkerAttempts)
}
