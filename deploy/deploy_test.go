// Package deploy holds Brood's deployment files (nats-server configs,
// compose, Kubernetes, systemd). Its tests check that every nats-server
// config says what deploy/README.md says it does, and run the configs: the
// dev node, and the 3-node cluster with Brood's services connected as the
// users the cluster defines.
package deploy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/bcrypt"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/collector"
	"github.com/brood-dev/brood/services/coordinator"
	spawnworker "github.com/brood-dev/brood/services/spawn-worker"
)

// Paths relative to this directory (go test runs in it).
const (
	devConf    = "nats/dev.conf"
	clusterDir = "nats/cluster"
	// siteDir holds the leaf nodes of sites (leaf_test.go).
	siteDir = "nats/site"
	// loopbackDir holds configs that must never listen beyond 127.0.0.1.
	loopbackDir = "nats"
)

// payloadBytesMax is the max message size every config must set (docs/design.md §4).
const payloadBytesMax = 1 << 20

// authorityUser is the only subject that mints user grants (docs/design.md §7).
const authorityUser = "brood.v1.coord.authority.user"

// Users of accounts.conf, the environment variable nats-server reads each
// password from, and the plain password the tests use.
var users = []struct {
	name, env, password string
	// bcrypt: give nats-server a bcrypt hash (quoted, as accounts.conf
	// documents) instead of the plain password.
	bcrypt bool
}{
	{"coordinator", "BROOD_NATS_COORDINATOR_PASSWORD", "coordinatorTestSecret1", false},
	{"worker-spawn", "BROOD_NATS_WORKER_SPAWN_PASSWORD", "workerSpawnTestSecret1", false},
	{"worker-fork", "BROOD_NATS_WORKER_FORK_PASSWORD", "workerForkTestSecret1", false},
	{"worker-acp", "BROOD_NATS_WORKER_ACP_PASSWORD", "workerAcpTestSecret1", false},
	{"client", "BROOD_NATS_CLIENT_PASSWORD", "clientTestSecret1", false},
	{"a2a-gateway", "BROOD_NATS_A2A_GATEWAY_PASSWORD", "a2aGatewayTestSecret1", false},
	{"trusted-host", "BROOD_NATS_TRUSTED_PASSWORD", "trustedTestSecret1", true},
	{"admin", "BROOD_NATS_ADMIN_PASSWORD", "adminTestSecret1", false},
	{"collector", "BROOD_NATS_COLLECTOR_PASSWORD", "collectorTestSecret1", false},
	{"sys", "BROOD_NATS_SYS_PASSWORD", "sysTestSecret1", false},
	// The local worker users of the site of nats/site (leaf_test.go).
	{"site-worker-spawn", "BROOD_SITE_WORKER_SPAWN_PASSWORD", "siteSpawnTestSecret1", false},
	{"site-worker-fork", "BROOD_SITE_WORKER_FORK_PASSWORD", "siteForkTestSecret1", false},
	{"site-worker-acp", "BROOD_SITE_WORKER_ACP_PASSWORD", "siteAcpTestSecret1", false},
}

func passwordOf(t testing.TB, user string) string {
	t.Helper()
	for _, u := range users {
		if u.name == user {
			return u.password
		}
	}
	t.Fatalf("no test password for user %q", user)
	return ""
}

// setPasswords puts every password variable of accounts.conf in the
// environment, so configs that include it can be processed.
func setPasswords(t testing.TB) {
	t.Helper()
	for _, u := range users {
		v := u.password
		if u.bcrypt {
			h, err := bcrypt.GenerateFromPassword([]byte(u.password), bcrypt.MinCost)
			if err != nil {
				t.Fatal(err)
			}
			v = `"` + string(h) + `"`
		}
		t.Setenv(u.env, v)
	}
	for _, p := range siteProviders {
		t.Setenv(siteSeedEnv(p), string(siteKey(t, p).seed))
	}
}

// confFiles lists every .conf under this directory, sorted.
func confFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".conf") {
			out = append(out, filepath.ToSlash(p))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	if len(out) == 0 {
		t.Fatal("no .conf files found under deploy/")
	}
	return out
}

var includeRE = regexp.MustCompile(`(?m)^\s*include\s+"?([^"\s;]+)"?`)

// fragments returns the .conf files that other configs include: they hold
// accounts and users, not a server.
func fragments(t *testing.T, files []string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range includeRE.FindAllStringSubmatch(string(data), -1) {
			out[filepath.ToSlash(filepath.Join(filepath.Dir(f), m[1]))] = true
		}
	}
	return out
}

func processConf(t testing.TB, path string) *server.Options {
	t.Helper()
	o, err := server.ProcessConfigFile(withTestRouteTLS(t, path))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return o
}

func TestEveryConfig(t *testing.T) {
	setPasswords(t)
	files := confFiles(t)
	frags := fragments(t, files)
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			o := processConf(t, f)
			if frags[f] {
				if len(o.Users) == 0 {
					t.Fatalf("%s is included by a server config but defines no users", f)
				}
				checkPermissionsStatic(t, o)
				return
			}
			checkServer(t, f, o)
			if strings.HasPrefix(f, siteDir+"/") {
				checkSite(t, o)
				return
			}
			if len(o.Users) > 0 {
				checkPermissionsStatic(t, o)
			}
		})
	}
}

// checkServer checks what every Brood nats-server must state.
func checkServer(t *testing.T, path string, o *server.Options) {
	t.Helper()
	if !o.JetStream {
		t.Errorf("JetStream is not enabled")
	}
	if o.StoreDir == "" {
		t.Errorf("jetstream store_dir is not set")
	}
	// ProcessConfigFile leaves SyncInterval zero unless the file states
	// sync_interval (docs/design.md §4, §12: say which mode a deployment runs in).
	if !o.SyncAlways && o.SyncInterval <= 0 {
		t.Errorf("jetstream sync_interval is not stated (the server would silently use its 2 min default)")
	}
	if o.SyncInterval > 2*time.Minute {
		t.Errorf("sync_interval %s is longer than the server default of 2m", o.SyncInterval)
	}
	if o.MaxPayload != payloadBytesMax {
		t.Errorf("max_payload = %d, want %d (1 MiB)", o.MaxPayload, payloadBytesMax)
	}
	if len(o.Users) == 0 && len(o.Nkeys) == 0 && o.Username == "" && o.Authorization == "" {
		// Without authentication anyone who reaches the port can mint user
		// grants; such a server must only listen on loopback.
		requireLoopback(t, o)
	}
	if strings.HasPrefix(path, loopbackDir+"/") {
		requireLoopback(t, o)
	}
}

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// requireLoopback fails unless every listener and route of o is on loopback.
func requireLoopback(t testing.TB, o *server.Options) {
	t.Helper()
	if !isLoopbackHost(o.Host) {
		t.Errorf("client listener %q is not loopback", o.Host)
	}
	if o.HTTPPort != 0 && !isLoopbackHost(o.HTTPHost) {
		t.Errorf("monitoring listener %q is not loopback", o.HTTPHost)
	}
	if o.Cluster.Port != 0 && !isLoopbackHost(o.Cluster.Host) {
		t.Errorf("cluster listener %q is not loopback", o.Cluster.Host)
	}
	for _, r := range o.Routes {
		if !isLoopbackHost(r.Hostname()) {
			t.Errorf("route %s is not loopback", r.Redacted())
		}
	}
	if o.LeafNode.Port != 0 && !isLoopbackHost(o.LeafNode.Host) {
		t.Errorf("leafnode listener %q is not loopback", o.LeafNode.Host)
	}
	for _, r := range o.LeafNode.Remotes {
		for _, u := range r.URLs {
			if !isLoopbackHost(u.Hostname()) {
				t.Errorf("leafnode remote %s is not loopback", u.Redacted())
			}
		}
	}
	if o.Gateway.Port != 0 || o.Websocket.Port != 0 || o.MQTT.Port != 0 {
		t.Errorf("gateway, websocket or MQTT listener configured")
	}
}

func TestClusterTopology(t *testing.T) {
	setPasswords(t)
	files := confFiles(t)
	frags := fragments(t, files)
	byDir := map[string][]*server.Options{}
	for _, f := range files {
		if frags[f] {
			continue
		}
		o := processConf(t, f)
		if o.Cluster.Name != "" {
			byDir[filepath.Dir(f)] = append(byDir[filepath.Dir(f)], o)
		}
	}
	if len(byDir[clusterDir]) == 0 {
		t.Fatalf("no cluster configs in %s", clusterDir)
	}
	for dir, nodes := range byDir {
		t.Run(dir, func(t *testing.T) { checkCluster(t, nodes) })
	}
}

// routeAddr is where the other nodes of a cluster reach node o: the
// address it advertises (compose: its alias on the routes network), else its
// cluster listener, named by its server name when it listens on every
// interface.
func routeAddr(o *server.Options) string {
	if o.Cluster.Advertise != "" {
		return o.Cluster.Advertise
	}
	h := o.Cluster.Host
	if h == "" || h == "0.0.0.0" || h == "::" {
		h = o.ServerName
	}
	return net.JoinHostPort(h, strconv.Itoa(o.Cluster.Port))
}

func checkCluster(t *testing.T, nodes []*server.Options) {
	t.Helper()
	if len(nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(nodes))
	}
	names := map[string]bool{}
	stores := map[string]bool{}
	for _, o := range nodes {
		if o.ServerName == "" || names[o.ServerName] {
			t.Errorf("server name %q is empty or not distinct", o.ServerName)
		}
		names[o.ServerName] = true
		if stores[o.StoreDir] && isLoopbackHost(o.Host) {
			t.Errorf("store_dir %q shared by two nodes on one machine", o.StoreDir)
		}
		stores[o.StoreDir] = true
		if o.Cluster.Name != nodes[0].Cluster.Name {
			t.Errorf("cluster name %q differs from %q", o.Cluster.Name, nodes[0].Cluster.Name)
		}
	}
	for i, o := range nodes {
		var want, got []string
		for j, p := range nodes {
			if j != i {
				want = append(want, routeAddr(p))
			}
		}
		for _, r := range o.Routes {
			got = append(got, r.Host)
			// No route secret ships (docs/security.md): routes carry none.
			if r.User != nil {
				t.Errorf("%s: route %s carries credentials", o.ServerName, r.Redacted())
			}
		}
		sort.Strings(want)
		sort.Strings(got)
		if !slices.Equal(want, got) {
			t.Errorf("%s routes to %v, want the other nodes %v", o.ServerName, got, want)
		}
		// Routes authenticate by certificate: each node presents one and
		// verifies its peers' against the deployment's CA (mutual TLS).
		if c := o.Cluster.TLSConfig; c == nil || c.ClientAuth != tls.RequireAndVerifyClientCert || c.ClientCAs == nil || len(c.Certificates) == 0 {
			t.Errorf("%s: routes are not authenticated by mutual TLS (cluster.tls with verify)", o.ServerName)
		}
		if o.Cluster.Username != "" || o.Cluster.Password != "" {
			t.Errorf("%s: the cluster has a route password (cluster.authorization): no route secret ships", o.ServerName)
		}
	}
	// On one machine the nodes also need distinct ports.
	if isLoopbackHost(nodes[0].Host) {
		ports := map[int]bool{}
		for _, o := range nodes {
			for _, p := range []int{o.Port, o.Cluster.Port, o.HTTPPort} {
				if p > 0 && ports[p] {
					t.Errorf("port %d used twice on one machine", p)
				}
				ports[p] = true
			}
		}
	}
}

// A permission expectation: may user publish to subject, or subscribe to it
// (in queue group queue)?
type permCase struct {
	user    string
	sub     bool
	subject string
	queue   string
	allowed bool
}

func (c permCase) String() string {
	op := "publish"
	if c.sub {
		op = "subscribe"
	}
	q := ""
	if c.queue != "" {
		q = " queue " + c.queue
	}
	verdict := "denied"
	if c.allowed {
		verdict = "allowed"
	}
	return fmt.Sprintf("%s %s %s%s %s", c.user, op, c.subject, q, verdict)
}

// permCases is the permission contract of accounts.conf (docs/security.md
// says why each holds; deploy/forgery_test.go tries the attacks behind them).
var permCases = []permCase{
	// Only trusted hosts mint grants over every session (docs/design.md §7).
	{user: "client", subject: authorityUser},
	{user: "worker-spawn", subject: authorityUser},
	{user: "trusted-host", subject: authorityUser, allowed: true},
	// Each user calls the coordinator on its own subject only.
	{user: "client", subject: "brood.v1.user.client.runs.start", allowed: true},
	{user: "client", subject: "brood.v1.user.client.continuable.followup", allowed: true},
	{user: "client", subject: "brood.v1.user.client.authority.user", allowed: true},
	{user: "client", subject: "brood.v1.user.client.follow.C1", allowed: true},
	{user: "client", subject: "brood.v1.user.trusted-host.runs.start"},
	{user: "client", subject: "brood.v1.user.worker-spawn.runs.start"},
	{user: "client", subject: "brood.v1.coord.runs.start"},
	{user: "client", subject: "brood.v1.coord.follow.C1"},
	{user: "a2a-gateway", subject: "brood.v1.user.a2a-gateway.providers.list", allowed: true},
	{user: "a2a-gateway", subject: "_INBOX.a2a-gateway.x", sub: true, allowed: true},
	{user: "a2a-gateway", subject: "brood.v1.user.client.continuable.followup"},
	{user: "a2a-gateway", subject: "brood.v1.coord.continuable.followup"},
	{user: "a2a-gateway", subject: authorityUser},
	{user: "a2a-gateway", subject: "$JS.API.STREAM.INFO.BROOD_SESSIONS"},
	{user: "a2a-gateway", subject: "_INBOX.client.x", sub: true},
	{user: "trusted-host", subject: "brood.v1.user.trusted-host.providers.list", allowed: true},
	{user: "trusted-host", subject: "brood.v1.user.client.providers.list"},
	{user: "trusted-host", subject: "brood.v1.coord.runs.start"},
	{user: "worker-spawn", subject: "brood.v1.user.worker-spawn.runs.start", allowed: true},
	{user: "worker-spawn", subject: "brood.v1.user.worker-spawn.descendants.dispose", allowed: true},
	{user: "worker-spawn", subject: "brood.v1.user.worker-spawn.authority.user"},
	{user: "worker-spawn", subject: "brood.v1.user.client.runs.start"},
	{user: "worker-spawn", subject: "brood.v1.coord.runs.start"},
	// An ACP bridge asks for approval for its children (permission ask,
	// docs/protocol.md §5.21) on its own subject; the request records
	// only coordinators write.
	{user: "worker-acp", subject: "brood.v1.user.worker-acp.requests.open", allowed: true},
	{user: "worker-acp", subject: "brood.v1.user.worker-acp.requests.get", allowed: true},
	{user: "worker-acp", subject: "brood.v1.user.client.requests.open"},
	{user: "worker-acp", subject: "$KV.brood_agents.request.r1"},
	// Budget ledgers only coordinators write (docs/protocol.md §5.5,
	// "Budgets"): a worker reserves through budget.reserve on its own
	// subject, never on the ledger.
	{user: "worker-spawn", subject: "brood.v1.user.worker-spawn.budget.reserve", allowed: true},
	{user: "worker-spawn", subject: "$KV.brood_agents.budget.S1"},
	{user: "worker-acp", subject: "$KV.brood_agents.budget.S1"},
	// Start queues only coordinators write (docs/protocol.md §5.5, "The
	// start queue"): a worker cannot queue, reorder or drop a start.
	{user: "worker-spawn", subject: "$KV.brood_agents.startqueue.S1"},
	{user: "worker-fork", subject: "$KV.brood_agents.startqueue.S1"},
	{user: "worker-acp", subject: "$KV.brood_agents.startqueue.S1"},
	{user: "coordinator", subject: "$KV.brood_agents.startqueue.S1", allowed: true},
	{user: "worker-fork", subject: "$KV.brood_agents.budget.S1"},
	// Only coordinators ask an instance to continue a run whose host died
	// (docs/protocol.md §9.3, provider continue): no worker takes over
	// another instance's run, of its own provider or another, nor serves
	// another provider's continue.
	{user: "coordinator", subject: "brood.v1.provider.spawn.spawn.H1.continue", allowed: true},
	{user: "worker-spawn", subject: "brood.v1.provider.spawn.spawn.H2.continue"},
	{user: "worker-spawn", subject: "brood.v1.provider.fork.fork.H2.continue"},
	{user: "worker-fork", subject: "brood.v1.provider.spawn.spawn.H1.continue"},
	{user: "worker-acp", subject: "brood.v1.provider.spawn.spawn.H1.continue"},
	{user: "client", subject: "brood.v1.provider.spawn.spawn.H1.continue"},
	{user: "worker-spawn", sub: true, subject: "brood.v1.provider.spawn.spawn.H1.continue", queue: "brood-provider", allowed: true},
	{user: "worker-spawn", sub: true, subject: "brood.v1.provider.spawn.spawn.H1.continue"},
	{user: "worker-acp", sub: true, subject: "brood.v1.provider.spawn.spawn.H1.continue", queue: "brood-provider"},
	// budget.raise on a worker's own subject is an agent's (its parent's
	// credential decides); on another user's subject it is denied.
	{user: "worker-spawn", subject: "brood.v1.user.worker-spawn.budget.raise", allowed: true},
	{user: "worker-spawn", subject: "brood.v1.user.client.budget.raise"},
	{user: "worker-spawn", subject: "brood.v1.coord.budget.raise"},
	{user: "coordinator", subject: "brood.v1.coord.runs.start"},
	// Clients go through the coordinator and touch nothing else: no stream
	// subject, no KV key, no JetStream API (so no consumer that delivers
	// into a Brood subject), no provider or host subject, no discovery.
	{user: "client", subject: "brood.v1.provider.spawn.start"},
	{user: "client", subject: "brood.v1.host.H1.dispose"},
	{user: "client", subject: "brood.v1.session.S1"},
	{user: "client", subject: "brood.v1.log.spawn.S1"},
	{user: "client", subject: "brood.v1.log.root.S1"},
	{user: "client", subject: "brood.v1.inbox.spawn.S1"},
	{user: "client", subject: "brood.v1.events.spawn.S1.end"},
	{user: "client", subject: "brood.v1.children.P1.S1"},
	{user: "client", subject: "brood.v1.wake.S1"},
	{user: "client", subject: "$KV.brood_agents.S1"},
	{user: "client", subject: "$JS.API.INFO"},
	{user: "client", subject: "$JS.API.STREAM.INFO.BROOD_LOG_root"},
	{user: "client", subject: "$JS.API.DIRECT.GET.BROOD_LOG_root"},
	{user: "client", subject: "$JS.API.DIRECT.GET.BROOD_SESSIONS.brood.v1.session.S1"},
	{user: "client", subject: "$JS.API.DIRECT.GET.KV_brood_agents.$KV.brood_agents.S1"},
	{user: "client", subject: "$JS.API.CONSUMER.CREATE.BROOD_LOG_root.C1.brood.v1.log.spawn.S1"},
	{user: "client", subject: "$JS.API.CONSUMER.CREATE.BROOD_EVENTS.C1"},
	{user: "client", subject: "$JS.API.CONSUMER.DURABLE.CREATE.BROOD_EVENTS.C1"},
	{user: "client", subject: "$JS.API.STREAM.CREATE.brood_coord"},
	{user: "client", subject: "$JS.API.STREAM.DELETE.BROOD_LOG_root"},
	{user: "client", subject: "$SRV.PING.brood-coordinator"},
	{user: "client", subject: "_INBOX.trusted-host.x"},
	{user: "trusted-host", subject: "$JS.API.CONSUMER.CREATE.BROOD_LOG_root.C1"},
	{user: "trusted-host", subject: "$KV.brood_agents.grant.abc"},
	{user: "trusted-host", subject: "brood.v1.inbox.spawn.S1"},
	{user: "trusted-host", subject: "brood.v1.session.S1"},
	// ... except the trusted host's own root logs (brood acp-agent).
	{user: "trusted-host", subject: "brood.v1.log.root.S1", allowed: true},
	{user: "trusted-host", subject: "brood.v1.log.spawn.S1"},
	{user: "trusted-host", subject: "$JS.API.DIRECT.GET.BROOD_LOG_root", allowed: true},
	// Workers write session logs, lifecycle events and settlement notices
	// (into a parent's inbox), never headers or the child index, and create
	// no consumer (a consumer's deliver subject is not checked).
	// Each provider's workers write only their own provider's logs
	// (brood.v1.log.<scope>.<sessionId>), not another's, not a root's.
	{user: "worker-spawn", subject: "brood.v1.log.spawn.S1", allowed: true},
	{user: "worker-spawn", subject: "brood.v1.log.fork.S1"},
	{user: "worker-spawn", subject: "brood.v1.log.root.S1"},
	{user: "worker-fork", subject: "brood.v1.log.fork.S1", allowed: true},
	{user: "worker-acp", subject: "brood.v1.log.acp.S1", allowed: true},
	// Lifecycle events only of its own provider's children.
	{user: "worker-spawn", subject: "brood.v1.events.spawn.S1.start", allowed: true},
	{user: "worker-spawn", subject: "brood.v1.events.fork.S1.end"},
	{user: "worker-fork", subject: "brood.v1.events.fork.S1.end", allowed: true},
	{user: "worker-acp", subject: "brood.v1.events.spawn.S1.start"},
	{user: "coordinator", subject: "brood.v1.events.fork.S1.end", allowed: true},
	{user: "worker-spawn", subject: "brood.v1.session.S1"},
	{user: "worker-spawn", subject: "brood.v1.children.P1.S1"},
	// Inbox items and wake-ups only coordinators publish: a host asks them
	// for its epochs' ends.
	{user: "worker-spawn", subject: "brood.v1.inbox.spawn.S1"},
	{user: "worker-spawn", subject: "brood.v1.wake.spawn.S1"},
	{user: "worker-acp", subject: "brood.v1.inbox.spawn.S1"},
	{user: "coordinator", subject: "brood.v1.wake.spawn.S1", allowed: true},
	// A provider's worker writes only its own scope's host records
	// (<scope>.<unique>, protocol.WorkerHostID): no other provider's, no
	// coordinator's, not the shared scope's.
	{user: "worker-spawn", subject: "$KV.brood_hosts.spawn.H1", allowed: true},
	{user: "worker-spawn", subject: "$KV.brood_hosts.fork.H1"},
	{user: "worker-spawn", subject: "$KV.brood_hosts.shared.H1"},
	{user: "worker-spawn", subject: "$KV.brood_hosts.H1"},
	{user: "worker-fork", subject: "$KV.brood_hosts.fork.H1", allowed: true},
	{user: "worker-acp", subject: "$KV.brood_hosts.acp.H1", allowed: true},
	{user: "worker-acp", subject: "$KV.brood_hosts.spawn.H1"},
	// ... and its own provider's children's leases, ownership and runs, but
	// no other provider's lease and no record only coordinators write.
	{user: "worker-spawn", subject: "$KV.brood_agents.lease.spawn.S1", allowed: true},
	{user: "worker-spawn", subject: "$KV.brood_agents.lease.fork.S1"},
	{user: "worker-spawn", subject: "$KV.brood_agents.lease.acp.S1"},
	{user: "worker-spawn", subject: "$KV.brood_agents.S1"},
	{user: "worker-fork", subject: "$KV.brood_agents.lease.fork.S1", allowed: true},
	{user: "worker-fork", subject: "$KV.brood_agents.lease.spawn.S1"},
	{user: "worker-acp", subject: "$KV.brood_agents.lease.acp.S1", allowed: true},
	{user: "worker-acp", subject: "$KV.brood_agents.lease.fork.S1"},
	{user: "coordinator", subject: "$KV.brood_agents.lease.fork.S1", allowed: true},
	// Ownership records only coordinators write; a worker asks them to
	// remove its own provider's children's edges.
	{user: "worker-spawn", subject: "$KV.brood_agents.owns.S1"},
	{user: "worker-fork", subject: "$KV.brood_agents.owns.S1"},
	{user: "coordinator", subject: "$KV.brood_agents.owns.S1", allowed: true},
	{user: "worker-spawn", subject: "brood.v1.epochend.spawn.S1", allowed: true},
	{user: "worker-spawn", subject: "brood.v1.epochend.fork.S1"},
	{user: "worker-acp", subject: "brood.v1.epochend.acp.S1", allowed: true},
	{user: "client", subject: "brood.v1.epochend.spawn.S1"},
	{user: "worker-spawn", subject: "$KV.brood_runs.state.spawn.R1", allowed: true},
	{user: "worker-spawn", subject: "$KV.brood_runs.state.fork.R1"},
	{user: "worker-spawn", subject: "$KV.brood_runs.spec.R1"},
	{user: "worker-spawn", subject: "$KV.brood_runs.R1"},
	{user: "worker-fork", subject: "$KV.brood_runs.state.fork.R1", allowed: true},
	{user: "coordinator", subject: "$KV.brood_runs.spec.R1", allowed: true},
	{user: "coordinator", subject: "$KV.brood_runs.state.fork.R1", allowed: true},
	// Run notices: a worker asks the coordinators for its own provider's
	// only, and publishes on no inbox; the coordinators publish them.
	{user: "worker-spawn", subject: "brood.v1.notice.spawn.R1", allowed: true},
	{user: "worker-spawn", subject: "brood.v1.notice.fork.R1"},
	{user: "worker-fork", subject: "brood.v1.notice.fork.R1", allowed: true},
	{user: "worker-spawn", subject: "_INBOX.client.brood.T1"},
	{user: "worker-spawn", subject: "_INBOX.worker-spawn.x"},
	// A worker's answers after a reconnect: only into its own scope's
	// host replies of the coordinators (rpc.Replies).
	{user: "worker-spawn", subject: "_INBOX.coordinator.host.spawn.ID.T1", allowed: true},
	{user: "worker-spawn", subject: "_INBOX.coordinator.host.fork.ID.T1"},
	{user: "worker-spawn", subject: "_INBOX.coordinator.x"},
	{user: "worker-spawn", subject: "_INBOX.coordinator.NUID.T1"},
	{user: "worker-fork", subject: "_INBOX.coordinator.host.fork.ID.T1", allowed: true},
	{user: "worker-fork", subject: "_INBOX.client.x"},
	{user: "worker-acp", subject: "_INBOX.trusted-host.x"},
	{user: "client", subject: "brood.v1.notice.spawn.R1"},
	{user: "coordinator", subject: "_INBOX.client.brood.T1", allowed: true},
	{user: "worker-spawn", subject: "$KV.brood_agents.grant.abc"},
	{user: "worker-spawn", subject: "$KV.brood_agents.root.R1"},
	{user: "worker-fork", subject: "$KV.brood_agents.root.R1"},
	{user: "coordinator", subject: "$KV.brood_agents.root.R1", allowed: true},
	{user: "worker-spawn", subject: "$KV.brood_agents.drain.all.sessions"},
	{user: "worker-spawn", subject: "$KV.brood_agents.slots.S1"},
	{user: "coordinator", subject: "$KV.brood_agents.grant.abc", allowed: true},
	// A retried write checks with the stream's leader whether it landed.
	{user: "worker-spawn", subject: "$JS.API.STREAM.MSG.GET.BROOD_LOG_spawn", allowed: true},
	// Lifecycle events a worker publishes and never reads (an end carries
	// its run's result text); the coordinators read them for their clients.
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.BROOD_EVENTS"},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.BROOD_EVENTS.brood.v1.events.fork.S1.end"},
	{user: "worker-fork", subject: "$JS.API.STREAM.MSG.GET.BROOD_EVENTS"},
	{user: "worker-acp", subject: "$JS.API.DIRECT.GET.BROOD_EVENTS"},
	{user: "coordinator", subject: "$JS.API.DIRECT.GET.BROOD_EVENTS", allowed: true},
	// KV records: a worker reads its own provider's keys by direct get, and
	// from the leader only through the coordinators (brood.v1.read.<p>.kvlatest).
	{user: "worker-spawn", subject: "$JS.API.STREAM.MSG.GET.KV_brood_agents"},
	{user: "worker-spawn", subject: "$JS.API.STREAM.MSG.GET.KV_brood_runs"},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.KV_brood_runs"},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.KV_brood_agents"},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.KV_brood_runs.$KV.brood_runs.spec.spawn.R1", allowed: true},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.KV_brood_runs.$KV.brood_runs.state.spawn.R1", allowed: true},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.KV_brood_agents.$KV.brood_agents.lease.spawn.S1", allowed: true},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.KV_brood_agents.$KV.brood_agents.owns.spawn.S1", allowed: true},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.KV_brood_runs.$KV.brood_runs.spec.fork.R1"},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.KV_brood_runs.$KV.brood_runs.spec.*.R1"},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.KV_brood_runs.$KV.brood_runs.state.fork.R1"},
	{user: "worker-fork", subject: "$JS.API.DIRECT.GET.KV_brood_agents.$KV.brood_agents.lease.spawn.S1"},
	{user: "worker-acp", subject: "$JS.API.DIRECT.GET.KV_brood_agents.$KV.brood_agents.owns.root.S1"},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.KV_brood_agents.$KV.brood_agents.root.S1"},
	{user: "worker-spawn", subject: "brood.v1.read.spawn.kvlatest.brood_runs", allowed: true},
	{user: "worker-spawn", subject: "brood.v1.read.fork.kvlatest.brood_runs"},
	{user: "trusted-host", subject: "$JS.API.STREAM.MSG.GET.BROOD_LOG_root", allowed: true},
	{user: "client", subject: "$JS.API.STREAM.MSG.GET.BROOD_LOG_root"},
	{user: "worker-spawn", subject: "$JS.API.STREAM.INFO.BROOD_LOG_spawn", allowed: true},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.BROOD_LOG_spawn", allowed: true},
	// Logs and inboxes: a stream per scope (BROOD_LOG_<scope>,
	// BROOD_INBOX_<scope>), so a worker reads only its own provider's, by
	// every get form (a batch or leader get names its stream in the API
	// subject, its subject only in the body); the fork provider's seed
	// comes from the coordinators (brood.v1.read.fork.forkseed.<childId>).
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.BROOD_LOG_spawn.brood.v1.log.spawn.S1", allowed: true},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.BROOD_INBOX_spawn", allowed: true},
	{user: "worker-spawn", subject: "$JS.API.STREAM.MSG.GET.BROOD_INBOX_spawn", allowed: true},
	{user: "worker-spawn", subject: "$JS.API.STREAM.INFO.BROOD_INBOX_spawn", allowed: true},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.BROOD_LOG_fork"},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.BROOD_LOG_fork.brood.v1.log.fork.S1"},
	{user: "worker-spawn", subject: "$JS.API.STREAM.MSG.GET.BROOD_LOG_fork"},
	{user: "worker-spawn", subject: "$JS.API.STREAM.INFO.BROOD_LOG_fork"},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.BROOD_LOG_root"},
	{user: "worker-spawn", subject: "$JS.API.STREAM.MSG.GET.BROOD_LOG_root"},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.BROOD_LOG_acp"},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.BROOD_INBOX_fork"},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.BROOD_INBOX_fork.brood.v1.inbox.fork.S1"},
	{user: "worker-spawn", subject: "$JS.API.STREAM.MSG.GET.BROOD_INBOX_fork"},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.BROOD_INBOX_root"},
	{user: "worker-spawn", subject: "$JS.API.STREAM.MSG.GET.BROOD_INBOX_root"},
	{user: "worker-spawn", subject: "$JS.API.STREAM.INFO.BROOD_INBOX_root"},
	{user: "worker-acp", subject: "$JS.API.DIRECT.GET.BROOD_LOG_acp", allowed: true},
	{user: "worker-acp", subject: "$JS.API.DIRECT.GET.BROOD_LOG_spawn"},
	{user: "worker-acp", subject: "$JS.API.STREAM.MSG.GET.BROOD_INBOX_spawn"},
	{user: "worker-fork", subject: "$JS.API.DIRECT.GET.BROOD_INBOX_fork", allowed: true},
	{user: "worker-fork", subject: "$JS.API.DIRECT.GET.BROOD_LOG_spawn"},
	{user: "worker-fork", subject: "$JS.API.STREAM.MSG.GET.BROOD_LOG_root"},
	{user: "worker-fork", subject: "$JS.API.DIRECT.GET.BROOD_INBOX_spawn"},
	{user: "worker-fork", subject: "$JS.API.STREAM.MSG.GET.BROOD_INBOX_root"},
	{user: "trusted-host", subject: "$JS.API.DIRECT.GET.BROOD_LOG_spawn"},
	{user: "trusted-host", subject: "$JS.API.STREAM.MSG.GET.BROOD_INBOX_root"},
	{user: "coordinator", subject: "$JS.API.STREAM.INFO.BROOD_INBOX_fork", allowed: true},
	{user: "coordinator", subject: "$JS.API.STREAM.NAMES", allowed: true},
	{user: "coordinator", subject: "$JS.API.STREAM.MSG.DELETE.BROOD_INBOX_spawn", allowed: true},
	{user: "coordinator", subject: "$JS.API.STREAM.MSG.DELETE.BROOD_LOG_spawn"},
	{user: "collector", subject: "$JS.API.STREAM.PURGE.BROOD_LOG_fork", allowed: true},
	{user: "collector", subject: "$JS.API.STREAM.PURGE.BROOD_INBOX_fork"},
	// Inbox items only coordinators delete: a host asks them, for what its
	// child's log claimed or discarded.
	{user: "worker-spawn", subject: "$JS.API.STREAM.MSG.DELETE.BROOD_INBOX_spawn"},
	{user: "worker-fork", subject: "$JS.API.STREAM.MSG.DELETE.BROOD_INBOX_fork"},
	{user: "coordinator", subject: "$JS.API.STREAM.MSG.DELETE.BROOD_INBOX_root", allowed: true},
	{user: "worker-spawn", subject: "brood.v1.inboxremove.spawn.S1", allowed: true},
	{user: "worker-spawn", subject: "brood.v1.inboxremove.fork.S1"},
	{user: "worker-acp", subject: "brood.v1.inboxremove.acp.S1", allowed: true},
	{user: "client", subject: "brood.v1.inboxremove.spawn.S1"},
	// No worker reads a session header: the start and activate requests
	// carry its child's, and reads across providers (a fork seed, an
	// ended ancestor) it asks the coordinators, for its own children only.
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.BROOD_SESSIONS"},
	{user: "worker-spawn", subject: "$JS.API.DIRECT.GET.BROOD_SESSIONS.brood.v1.session.S1"},
	{user: "worker-fork", subject: "$JS.API.STREAM.MSG.GET.BROOD_SESSIONS"},
	{user: "worker-acp", subject: "$JS.API.DIRECT.GET.BROOD_SESSIONS"},
	{user: "worker-spawn", subject: "$JS.API.STREAM.INFO.BROOD_SESSIONS", allowed: true},
	{user: "worker-fork", subject: "brood.v1.read.fork.forkseed.S1", allowed: true},
	{user: "worker-spawn", subject: "brood.v1.read.spawn.ancestry.S1", allowed: true},
	{user: "worker-spawn", subject: "brood.v1.read.fork.forkseed.S1"},
	{user: "worker-acp", subject: "brood.v1.read.spawn.ancestry.S1"},
	{user: "client", subject: "brood.v1.read.spawn.ancestry.S1"},
	{user: "worker-spawn", subject: "$JS.API.STREAM.MSG.DELETE.BROOD_LOG_spawn"},
	{user: "worker-spawn", subject: "$JS.API.CONSUMER.CREATE.BROOD_LOG_spawn.C1"},
	{user: "worker-spawn", subject: "$JS.API.CONSUMER.CREATE.BROOD_LOG_spawn.C1.brood.v1.log.spawn.S1"},
	{user: "worker-spawn", subject: "$JS.API.CONSUMER.CREATE.KV_brood_agents"},
	{user: "worker-spawn", subject: "$JS.API.INFO"},
	{user: "worker-spawn", subject: "brood.v1.provider.spawn.start"},
	{user: "worker-spawn", subject: "brood.v1.host.spawn.H1.dispose"},
	{user: "coordinator", subject: "brood.v1.children.P1.S1", allowed: true},
	{user: "coordinator", subject: "brood.v1.wake.S1", allowed: true},
	{user: "coordinator", subject: "brood.v1.provider.spawn.start", allowed: true},
	{user: "coordinator", subject: "brood.v1.host.H1.dispose", allowed: true},
	{user: "coordinator", subject: "brood.v1.inbox.spawn.S1", allowed: true},
	{user: "coordinator", subject: "$JS.API.CONSUMER.CREATE.BROOD_EVENTS.C1.brood.v1.events.*.*.*", allowed: true},
	{user: "coordinator", subject: "$JS.API.STREAM.PURGE.BROOD_INBOX_root"},
	{user: "coordinator", subject: "$JS.API.STREAM.PURGE.BROOD_LOG_root"},
	// The collector purges headers and logs, and nothing else.
	{user: "collector", subject: "$JS.API.STREAM.PURGE.BROOD_LOG_root", allowed: true},
	{user: "collector", subject: "$JS.API.STREAM.PURGE.BROOD_SESSIONS", allowed: true},
	{user: "collector", subject: "$JS.API.STREAM.PURGE.BROOD_INBOX_root"},
	{user: "collector", subject: "$JS.API.STREAM.PURGE.KV_brood_agents"},
	{user: "collector", subject: "$JS.API.STREAM.DELETE.BROOD_LOG_root"},
	{user: "collector", subject: "$JS.API.CONSUMER.CREATE.BROOD_LOG_root"},
	{user: "collector", subject: "$KV.brood_agents.closed.R1", allowed: true},
	{user: "collector", subject: "$KV.brood_agents.budget.R1", allowed: true},
	{user: "collector", subject: "$KV.brood_agents.root.R1"},
	{user: "collector", subject: "$KV.brood_agents.grant.G1"},
	{user: "collector", subject: "brood.v1.log.root.R1"},
	{user: "collector", subject: "brood.v1.inbox.spawn.S1"},
	{user: "collector", subject: authorityUser},
	{user: "collector", sub: true, subject: "_INBOX.client.>"},
	// Serving: coordinator endpoints only by coordinators in their queue group.
	{user: "coordinator", sub: true, subject: "brood.v1.coord.runs.start", queue: "brood-coordinator", allowed: true},
	{user: "coordinator", sub: true, subject: "brood.v1.user.*.runs.start", queue: "brood-coordinator", allowed: true},
	{user: "coordinator", sub: true, subject: "brood.v1.user.>", queue: "brood-coordinator-unknown-endpoints", allowed: true},
	{user: "coordinator", sub: true, subject: authorityUser, queue: "brood-coordinator", allowed: true},
	{user: "coordinator", sub: true, subject: "brood.v1.read.*.forkseed.*", queue: "brood-coordinator", allowed: true},
	{user: "coordinator", sub: true, subject: "brood.v1.read.*.ancestry.*", queue: "brood-coordinator", allowed: true},
	{user: "coordinator", sub: true, subject: "brood.v1.coord.runs.start"},
	{user: "coordinator", sub: true, subject: "brood.v1.user.*.runs.start"},
	{user: "coordinator", sub: true, subject: "brood.v1.coord.runs.start", queue: "mine"},
	{user: "worker-spawn", sub: true, subject: authorityUser, queue: "brood-coordinator"},
	{user: "worker-spawn", sub: true, subject: "brood.v1.user.*.runs.start", queue: "brood-coordinator"},
	{user: "client", sub: true, subject: authorityUser, queue: "brood-coordinator"},
	{user: "trusted-host", sub: true, subject: "brood.v1.coord.>"},
	// Provider endpoints only by workers in their queue group; host subjects.
	// Each provider's workers serve only their provider's instance subjects
	// and their own scope's host subjects.
	{user: "worker-spawn", sub: true, subject: "brood.v1.provider.spawn.spawn.H1.start", queue: "brood-provider", allowed: true},
	{user: "worker-spawn", sub: true, subject: "brood.v1.provider.spawn.spawn.H1.start"},
	{user: "worker-spawn", sub: true, subject: "brood.v1.provider.fork.fork.H2.start", queue: "brood-provider"},
	{user: "worker-spawn", sub: true, subject: "brood.v1.provider.>", queue: "brood-provider"},
	{user: "worker-fork", sub: true, subject: "brood.v1.provider.fork.fork.H2.activate", queue: "brood-provider", allowed: true},
	{user: "worker-fork", sub: true, subject: "brood.v1.provider.spawn.spawn.H1.start", queue: "brood-provider"},
	{user: "worker-acp", sub: true, subject: "brood.v1.provider.acp.acp.H3.start", queue: "brood-provider", allowed: true},
	{user: "worker-spawn", sub: true, subject: "brood.v1.host.spawn.H1.*", allowed: true},
	{user: "worker-spawn", sub: true, subject: "brood.v1.host.fork.H2.*"},
	{user: "worker-spawn", sub: true, subject: "brood.v1.host.*.*.*"},
	{user: "worker-fork", sub: true, subject: "brood.v1.host.fork.H2.*", allowed: true},
	{user: "worker-spawn", sub: true, subject: "$SRV.PING", allowed: true},
	{user: "worker-spawn", sub: true, subject: "$SRV.INFO.brood-provider-spawn", allowed: true},
	{user: "worker-spawn", sub: true, subject: "$SRV.INFO.brood-provider-spawn.ID1", allowed: true},
	{user: "worker-spawn", sub: true, subject: "$SRV.INFO.brood-provider-fork"},
	{user: "worker-spawn", sub: true, subject: "$SRV.INFO.brood-coordinator.ID1"},
	// A worker wakes on its own provider's wake-ups (empty), never sees an
	// inbox item as it is accepted, nor another provider's wake-ups.
	{user: "worker-spawn", sub: true, subject: "brood.v1.wake.spawn.S1", allowed: true},
	{user: "worker-spawn", sub: true, subject: "brood.v1.wake.spawn.*", allowed: true},
	{user: "worker-spawn", sub: true, subject: "brood.v1.wake.fork.S1"},
	{user: "worker-spawn", sub: true, subject: "brood.v1.wake.root.S1"},
	{user: "worker-spawn", sub: true, subject: "brood.v1.wake.>"},
	{user: "worker-fork", sub: true, subject: "brood.v1.wake.fork.S1", allowed: true},
	{user: "worker-spawn", sub: true, subject: "brood.v1.inbox.spawn.S1"},
	{user: "worker-spawn", sub: true, subject: "brood.v1.inbox.spawn.*"},
	{user: "worker-acp", sub: true, subject: "brood.v1.inbox.>"},
	{user: "coordinator", sub: true, subject: "brood.v1.inbox.spawn.S1", allowed: true},
	// Read endpoints: long polls and follows wake on log and event subjects;
	// follow credit comes on the replica's own subject in the queue group.
	{user: "coordinator", sub: true, subject: "brood.v1.log.spawn.S1", allowed: true},
	{user: "coordinator", sub: true, subject: "brood.v1.events.*.*.*", allowed: true},
	{user: "coordinator", sub: true, subject: "brood.v1.coord.follow.C1", queue: "brood-coordinator", allowed: true},
	{user: "coordinator", sub: true, subject: "brood.v1.user.*.follow.C1", queue: "brood-coordinator", allowed: true},
	{user: "coordinator", sub: true, subject: "brood.v1.notice.*.*", queue: "brood-coordinator", allowed: true},
	{user: "coordinator", sub: true, subject: "brood.v1.epochend.*.*", queue: "brood-coordinator", allowed: true},
	{user: "worker-spawn", sub: true, subject: "brood.v1.epochend.*.*", queue: "brood-coordinator"},
	{user: "coordinator", sub: true, subject: "brood.v1.inboxremove.*.*", queue: "brood-coordinator", allowed: true},
	{user: "worker-spawn", sub: true, subject: "brood.v1.inboxremove.*.*", queue: "brood-coordinator"},
	{user: "coordinator", sub: true, subject: "brood.v1.notice.*.*"},
	{user: "worker-spawn", sub: true, subject: "brood.v1.notice.*.*", queue: "brood-coordinator"},
	{user: "client", sub: true, subject: "brood.v1.inbox.spawn.S1"},
	{user: "client", sub: true, subject: "brood.v1.provider.spawn.start", queue: "brood-provider"},
	{user: "client", sub: true, subject: "brood.v1.host.H1.*"},
	{user: "client", sub: true, subject: "brood.v1.log.>"},
	{user: "client", sub: true, subject: "$SRV.>"},
	// Private replies: each user subscribes only under its own inbox prefix.
	{user: "client", sub: true, subject: "_INBOX.client.abc.>", allowed: true},
	{user: "client", sub: true, subject: "_INBOX.abc.>"},
	{user: "client", sub: true, subject: "_INBOX.>"},
	{user: "client", sub: true, subject: "_INBOX.trusted-host.>"},
	{user: "trusted-host", sub: true, subject: "_INBOX.trusted-host.abc", allowed: true},
	{user: "trusted-host", sub: true, subject: "_INBOX.client.abc"},
	{user: "worker-spawn", sub: true, subject: "_INBOX.worker-spawn.abc", allowed: true},
	{user: "worker-spawn", sub: true, subject: "_INBOX.client.abc"},
	{user: "coordinator", sub: true, subject: "_INBOX.coordinator.abc", allowed: true},
	{user: "coordinator", sub: true, subject: "_INBOX.trusted-host.abc"},
	// Stream administration belongs to the admin step (brood provision).
	{user: "admin", subject: "$JS.API.STREAM.CREATE.BROOD_LOG_root", allowed: true},
	{user: "admin", subject: "$JS.API.STREAM.UPDATE.KV_brood_agents", allowed: true},
	{user: "admin", sub: true, subject: "_INBOX.admin.abc", allowed: true},
	{user: "admin", subject: "brood.v1.log.spawn.S1"},
	{user: "coordinator", subject: "$JS.API.STREAM.CREATE.BROOD_LOG_root"},
	{user: "coordinator", subject: "$JS.API.STREAM.UPDATE.BROOD_LOG_root"},
	{user: "coordinator", subject: "$JS.API.STREAM.INFO.BROOD_LOG_root", allowed: true},
	{user: "worker-spawn", subject: "$JS.API.STREAM.CREATE.brood_coord"},
	{user: "worker-spawn", subject: "$JS.API.STREAM.UPDATE.BROOD_LOG_spawn"},
	{user: "worker-spawn", subject: "$JS.API.STREAM.UPDATE.KV_brood_agents"},
}

// checkPermissionsStatic evaluates permCases against the parsed users with
// the server's subject matching (the runtime test asks the server itself).
func checkPermissionsStatic(t *testing.T, o *server.Options) {
	t.Helper()
	byName := map[string]*server.User{}
	for _, u := range o.Users {
		byName[u.Username] = u
	}
	for _, c := range permCases {
		u, ok := byName[c.user]
		if !ok {
			t.Errorf("user %q is not defined", c.user)
			continue
		}
		if u.Account == nil || u.Account.Name != "BROOD" {
			t.Errorf("user %q is not in account BROOD", c.user)
		}
		if got := staticAllowed(u.Permissions, c); got != c.allowed {
			t.Errorf("%s: static evaluation says allowed=%v", c, got)
		}
	}
}

func staticAllowed(p *server.Permissions, c permCase) bool {
	if p == nil {
		return true
	}
	if !c.sub {
		sp := p.Publish
		if sp == nil {
			return true
		}
		allowed := sp.Allow == nil || matchesAny(sp.Allow, c.subject)
		return allowed && !matchesAny(sp.Deny, c.subject)
	}
	sp := p.Subscribe
	if sp == nil {
		return true
	}
	allowed := true
	if sp.Allow != nil {
		plain, queues := matchSubQueue(sp.Allow, c.subject)
		allowed = plain
		if c.queue != "" && len(queues) > 0 {
			allowed = slices.Contains(queues, c.queue)
		}
	}
	if allowed && sp.Deny != nil {
		plain, queues := matchSubQueue(sp.Deny, c.subject)
		allowed = !plain && !(c.queue != "" && slices.Contains(queues, c.queue))
	}
	return allowed
}

func matchesAny(filters []string, subject string) bool {
	for _, f := range filters {
		if server.SubjectMatchesFilter(subject, f) {
			return true
		}
	}
	return false
}

// matchSubQueue splits "subject [queue]" entries: plain reports a matching
// entry without a queue, queues lists the queues of matching entries with one.
func matchSubQueue(entries []string, subject string) (plain bool, queues []string) {
	for _, e := range entries {
		f := strings.Fields(e)
		if len(f) == 0 || !server.SubjectMatchesFilter(subject, f[0]) {
			continue
		}
		if len(f) == 1 {
			plain = true
		} else {
			queues = append(queues, f[1])
		}
	}
	return plain, queues
}

// startServers starts nats-servers from processed options: each gets its
// own temp store dir; when any configured port is taken, every port moves to
// a free one and the routes follow. Every listener must be loopback.
func startServers(t testing.TB, opts ...*server.Options) []*server.Server {
	t.Helper()
	var ports []int
	for _, o := range opts {
		requireLoopback(t, o)
		ports = append(ports, o.Port)
		if o.Cluster.Port > 0 {
			ports = append(ports, o.Cluster.Port)
		}
		if o.HTTPPort > 0 {
			ports = append(ports, o.HTTPPort)
		}
		if o.LeafNode.Port > 0 {
			ports = append(ports, o.LeafNode.Port)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if !portsFree(ports) {
		remapPorts(t, opts)
	}
	servers := make([]*server.Server, len(opts))
	for i, o := range opts {
		o.StoreDir = t.TempDir()
		o.NoSigs = true
		o.NoLog = true
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatalf("%s: %v", o.ServerName, err)
		}
		servers[i] = s
		t.Cleanup(func() {
			s.Shutdown()
			s.WaitForShutdown()
		})
		go s.Start()
	}
	for _, s := range servers {
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatalf("%s not accepting clients after 10s", s.Name())
		}
	}
	return servers
}

func portsFree(ports []int) bool {
	for _, p := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			return false
		}
		_ = l.Close()
	}
	return true
}

// remapPortMin and remapPortMax bound the ports remapPorts picks from: below
// the kernel's ephemeral range (Linux 32768-60999, macOS and Windows from
// 49152). A port bind(0) picks lies in that range, where the kernel also
// picks the source port of every outgoing connection, so a node's port,
// free while the node is down, could be held by a connection of the test's
// clients, proxies or anything else on the machine when the node restarts
// (TestLeaderElectionsAreNotFailures: "brood-nats-3 not accepting clients"
// after a restart, on main 6695120 and after issue 9's fix alike).
const (
	remapPortMin = 20000
	remapPortMax = 32000
)

// remapPorts moves every listener of opts to a free loopback port between
// remapPortMin and remapPortMax and rewrites the routes to match.
func remapPorts(t testing.TB, opts []*server.Options) {
	t.Helper()
	var held []net.Listener
	free := func() int {
		for range 1000 {
			p := remapPortMin + rand.IntN(remapPortMax-remapPortMin)
			if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p))); err == nil {
				held = append(held, l)
				return p
			}
		}
		t.Fatalf("no free loopback port between %d and %d", remapPortMin, remapPortMax)
		return 0
	}
	cluster := map[string]int{} // old host:port -> new port
	for _, o := range opts {
		o.Port = free()
		if o.HTTPPort > 0 {
			o.HTTPPort = free()
		}
		if o.LeafNode.Port > 0 {
			o.LeafNode.Port = free()
		}
		if o.Cluster.Port > 0 {
			old := net.JoinHostPort(o.Cluster.Host, strconv.Itoa(o.Cluster.Port))
			o.Cluster.Port = free()
			cluster[old] = o.Cluster.Port
		}
	}
	for _, l := range held {
		_ = l.Close()
	}
	for _, o := range opts {
		for i, r := range o.Routes {
			p, ok := cluster[r.Host]
			if !ok {
				t.Fatalf("%s: route %s names no node of this cluster", o.ServerName, r.Redacted())
			}
			nr := *r
			nr.Host = net.JoinHostPort(r.Hostname(), strconv.Itoa(p))
			o.Routes[i] = &nr
		}
	}
	t.Logf("listeners moved to free loopback ports")
}

// waitFor polls cond until it holds or total passes.
func waitFor(t testing.TB, total time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, total, cond, "%s", what)
}

// violations records the permission violations a connection was told about.
type violations struct {
	mu   sync.Mutex
	errs []string
}

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	if errors.Is(err, nats.ErrPermissionViolation) {
		v.mu.Lock()
		v.errs = append(v.errs, err.Error())
		v.mu.Unlock()
	}
}

func (v *violations) list() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.errs...)
}

// connectAs connects to urls (comma-separated) as user with its test password.
func connectAs(t testing.TB, urls, user string, v *violations) *nats.Conn {
	t.Helper()
	if v == nil {
		v = &violations{}
	}
	nc, err := nats.Connect(urls, nats.UserInfo(user, passwordOf(t, user)), nats.Name("deploy-test-"+user),
		nats.CustomInboxPrefix(protocol.UserInboxPrefix(user)), nats.Timeout(5*time.Second), nats.ErrorHandler(v.handler))
	if err != nil {
		t.Fatalf("connect as %s to %s: %v", user, urls, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// allowedAtRuntime asks the server: a refused publish or subscription comes
// back as a permission violation naming the subject before the flush's PONG.
func allowedAtRuntime(t *testing.T, url string, c permCase) bool {
	t.Helper()
	nc := connectAs(t, url, c.user, nil)
	defer nc.Close()
	var err error
	switch {
	case !c.sub:
		err = nc.Publish(c.subject, nil)
	case c.queue != "":
		_, err = nc.QueueSubscribeSync(c.subject, c.queue)
	default:
		_, err = nc.SubscribeSync(c.subject)
	}
	if err != nil {
		t.Fatalf("%s: %v", c, err)
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatalf("%s: flush: %v", c, err)
	}
	last := nc.LastError()
	return !(errors.Is(last, nats.ErrPermissionViolation) && strings.Contains(last.Error(), strconv.Quote(c.subject)))
}

func clusterOptions(t testing.TB) []*server.Options {
	t.Helper()
	var opts []*server.Options
	for i := 1; i <= 3; i++ {
		opts = append(opts, processConf(t, fmt.Sprintf("%s/node-%d.conf", clusterDir, i)))
	}
	return opts
}

// waitMetaLeader waits until one node leads the JetStream meta group and
// knows every node as a live JetStream peer (until then, placing an R3
// stream fails with "no suitable peers for placement").
func waitMetaLeader(t testing.TB, servers []*server.Server) {
	t.Helper()
	waitFor(t, 10*time.Second, "JetStream meta leader with every peer", func() bool {
		for _, s := range servers {
			if s.JetStreamIsLeader() {
				return len(s.JetStreamClusterPeers()) == len(servers)
			}
		}
		return false
	})
}

func TestDevConfigServes(t *testing.T) {
	o := processConf(t, devConf)
	servers := startServers(t, o)
	nc, err := nats.Connect(servers[0].ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := nc.MaxPayload(); got != payloadBytesMax {
		t.Errorf("server announces max payload %d, want %d", got, payloadBytesMax)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		t.Fatalf("JetStream not available: %v", err)
	}
	if cfg := servers[0].JetStreamConfig(); cfg == nil || cfg.SyncInterval != 2*time.Minute || cfg.SyncAlways {
		t.Errorf("JetStream sync = %+v, want the stated 2m interval", cfg)
	}
}

// TestClusterRuns starts the 3-node cluster from deploy/nats/cluster and
// checks the permissions with the server, then runs a coordinator, a spawn
// worker and a client as the users the cluster defines.
func TestClusterRuns(t *testing.T) {
	setPasswords(t)
	servers := startServers(t, clusterOptions(t)...)
	waitMetaLeader(t, servers)
	urls := make([]string, len(servers))
	for i, s := range servers {
		urls[i] = s.ClientURL()
	}

	t.Run("permissions", func(t *testing.T) {
		for i, c := range permCases {
			if got := allowedAtRuntime(t, urls[i%len(urls)], c); got != c.allowed {
				t.Errorf("%s: the server says allowed=%v", c, got)
			}
		}
	})

	t.Run("only the trusted host reaches authority.user", func(t *testing.T) {
		// A coordinator-user responder on node 1; callers on nodes 2 and 3,
		// so the subject also crosses routes.
		srv := connectAs(t, urls[0], "coordinator", nil)
		got := make(chan string, 16)
		_, err := srv.QueueSubscribe(authorityUser, protocol.CoordinatorQueue, func(m *nats.Msg) {
			got <- string(m.Data)
			_ = m.Respond([]byte("ok"))
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Flush(); err != nil {
			t.Fatal(err)
		}

		cl := connectAs(t, urls[1], "client", nil)
		if err := cl.Publish(authorityUser, []byte("client")); err != nil {
			t.Fatal(err)
		}
		if err := cl.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := cl.LastError(); !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("client publish to %s: last error %v, want a permission violation", authorityUser, err)
		}

		trusted := connectAs(t, urls[2], "trusted-host", nil)
		var reply *nats.Msg
		waitFor(t, 5*time.Second, "trusted host's request answered", func() bool {
			reply, err = trusted.Request(authorityUser, []byte("trusted"), 250*time.Millisecond)
			return err == nil
		})
		if string(reply.Data) != "ok" || trusted.LastError() != nil {
			t.Fatalf("trusted host: reply %q, last error %v", reply.Data, trusted.LastError())
		}
		// Nothing but the trusted host's requests reached the coordinator.
		for len(got) > 0 {
			if m := <-got; m != "trusted" {
				t.Fatalf("coordinator received %q on %s", m, authorityUser)
			}
		}
	})

	t.Run("brood services as their users", func(t *testing.T) {
		testBroodOnCluster(t, urls)
	})
}

// testBroodOnCluster runs what `brood provision --replicas 3` (as admin),
// `brood coordinator --replicas 3`, `brood spawn-worker --replicas 3` and
// `brood run` do, each as its own user, and fails on any permission
// violation a connection was told about.
func testBroodOnCluster(t *testing.T, urls []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	subj := protocol.MustSubjects("")
	cfg := store.DefaultConfig()
	cfg.Replicas = 3
	v := &violations{}
	all := strings.Join(urls, ",")

	// The admin step (brood provision --replicas 3), then each service
	// checks the streams and buckets as its own user, never changing them.
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	defer pcancel()
	if _, err := store.Provision(pctx, connectAs(t, all, "admin", v), subj, cfg); err != nil {
		t.Fatalf("provision R3 streams and buckets as admin: %v", err)
	}
	open := func(nc *nats.Conn) *store.Store {
		t.Helper()
		octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
		defer ocancel()
		st, err := store.Open(octx, nc, subj, openConfig(nc, cfg))
		if err != nil {
			t.Fatalf("open R3 streams and buckets as %s: %v", nc.Opts.User, err)
		}
		return st
	}

	coordNC := connectAs(t, all, "coordinator", v)
	coordStore := open(coordNC)
	rootLog, err := coordStore.LogStream(ctx, protocol.ScopeRoot)
	if err != nil {
		t.Fatal(err)
	}
	rootInbox, err := coordStore.InboxStream(ctx, protocol.ScopeRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, str := range []jetstream.Stream{coordStore.Sessions, rootLog, rootInbox, coordStore.Events} {
		if info := str.CachedInfo(); info.Config.Replicas != 3 || info.Config.Storage != jetstream.FileStorage {
			t.Fatalf("stream %s: %d replicas, %s storage; want R3 file", info.Config.Name, info.Config.Replicas, info.Config.Storage)
		}
	}
	coord, err := coordinator.New(coordinator.Config{
		NC: coordNC, Store: coordStore, HeartbeatInterval: stack.Heartbeat,
		HostExpiry: stack.HostExpiry, Logger: testutil.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Background(t, coord)
	select {
	case <-coord.Ready():
	case <-ctx.Done():
		t.Fatal("coordinator not serving")
	}

	workerNC := connectAs(t, urls[1], "worker-spawn", v)
	w, err := spawnworker.New(spawnworker.Config{
		NC: workerNC, Store: open(workerNC),
		Models:            func() (model.Model, error) { return model.NewScripted(), nil },
		HeartbeatInterval: stack.Heartbeat, HostExpiry: stack.HostExpiry,
		DrainGrace: 2 * time.Second, Logger: testutil.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Background(t, w)

	clientNC := connectAs(t, urls[2], "client", v)
	cl, err := client.New(clientNC, client.Options{AwaitFallback: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	waitFor(t, 10*time.Second, "spawn listed to the client", func() bool {
		r, err := cl.Providers(ctx)
		return err == nil && r.Instances[spawnworker.DefaultName] > 0
	})

	root, err := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	run, err := cl.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: spawnworker.DefaultName, Prompt: protocol.Text("say ok"), Options: protocol.StartOptions{}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := run.Result(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.StopReason != protocol.StopCompleted || len(res.Output) != 1 || res.Output[0].Text != "ok" {
		t.Fatalf("result %+v, want completed with output ok", res)
	}
	// The root's own credential reads its child's log through the coordinator.
	l, err := cl.Log(ctx, protocol.LogReadRequest{SessionID: run.ChildID, Authority: root.Authority()})
	if err != nil {
		t.Fatalf("client reads the child's log: %v", err)
	}
	if l.Header.ID != run.ChildID || len(l.Events) == 0 {
		t.Fatalf("log of %s: header %s, %d events", run.ChildID, l.Header.ID, len(l.Events))
	}
	if err := root.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// The collector, as its own user, removes the closed root's tree once
	// past its retention (its clock runs a retention ahead).
	collNC := connectAs(t, urls[0], "collector", v)
	gc, err := collector.New(collector.Config{Store: open(collNC), Retention: time.Minute, Logger: testutil.Logger(t),
		Now: func() time.Time { return time.Now().Add(2 * time.Minute) }})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the closed root's tree collected", func() bool {
		st, err := gc.Sweep(ctx)
		return err == nil && st.Collected == 1 && st.Sessions == 2
	})
	for _, id := range []string{root.Ref().SessionID, run.ChildID} {
		if _, err := coordStore.GetHeader(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("the header of %s after its tree was collected: %v, want not found", id, err)
		}
	}
	if vs := v.list(); len(vs) > 0 {
		t.Fatalf("permission violations while Brood ran:\n%s", strings.Join(vs, "\n"))
	}
}

// BenchmarkAckedPublish measures what the sync_interval choice costs: one
// acknowledged 4 KiB publish to a file stream, on the dev node (R1) and on
// the cluster (R3), with the stated 2m interval and with `always`.
//
//	go test -run '^$' -bench AckedPublish -benchtime 3s ./deploy/
func BenchmarkAckedPublish(b *testing.B) {
	for _, always := range []bool{false, true} {
		mode := "interval-2m"
		if always {
			mode = "always"
		}
		b.Run("dev-R1/"+mode, func(b *testing.B) {
			o := processConf(b, devConf)
			o.SyncAlways = always
			servers := startServers(b, o)
			benchPublish(b, servers[0].ClientURL(), nil, 1)
		})
		b.Run("cluster-R3/"+mode, func(b *testing.B) {
			setPasswords(b)
			opts := clusterOptions(b)
			for _, o := range opts {
				o.SyncAlways = always
			}
			servers := startServers(b, opts...)
			waitMetaLeader(b, servers)
			benchPublish(b, servers[0].ClientURL(), nats.UserInfo("coordinator", passwordOf(b, "coordinator")), 3)
		})
	}
}

func benchPublish(b *testing.B, url string, auth nats.Option, replicas int) {
	var opts []nats.Option
	if auth != nil {
		opts = append(opts, auth)
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "BROOD_LOG_root", Subjects: []string{"brood.v1.log.root.*"}, Storage: jetstream.FileStorage, Replicas: replicas,
	}); err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 4<<10)
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for b.Loop() {
		if _, err := js.Publish(context.Background(), "brood.v1.log.root.bench", data); err != nil {
			b.Fatal(err)
		}
	}
}
