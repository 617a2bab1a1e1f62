// Package chaos tests Brood the way Jepsen tests databases: a 3-node
// JetStream cluster with a TCP proxy on every route and client connection,
// real `brood` processes, a seeded workload whose every client operation is
// recorded (invoke, then ok, fail or unknown), a seeded fault schedule, and a
// checker that reads the durable state once the faults healed and verifies
// the invariants of shared/RELIABILITY.md (I1–I8, I10, I11, L1).
//
// The harness (Cluster, Node, Endpoint, Process) is usable on its own, from
// any Go test, to run a provider of your own against faults: see
// docs/chaos.md.
//
// Nodes are the nats-server Brood embeds (the one its binary ships), each run by
// `brood nats-server --config FILE` as a process of its own rather than
// inside the test process: a Go library has no abrupt stop (its Shutdown
// flushes and snapshots), so only a process can be killed -9 or paused with
// SIGSTOP, and a server in the test binary would run under the race detector
// and share the test's heap.
package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

// ClusterConfig configures a Cluster.
type ClusterConfig struct {
	// Dir holds every node's store, config and log, and the process logs. Required.
	Dir string
	// Nodes is the number of nats-server nodes (3).
	Nodes int
	// ServerCommand starts a node; the node's config file path is appended.
	// Brood's own: {brood, "nats-server", "--config"} (see Build); a
	// nats-server binary: {"nats-server", "-c"}. Required.
	ServerCommand []string
	// SyncAlways lists the nodes (0-based) started with `sync_interval:
	// always`; the others keep the server default, stated in their config as
	// deploy/nats/cluster does ("2m").
	SyncAlways []int
	// Name of the cluster ("brood-chaos").
	Name string
	// ReadyTimeout bounds a node's start and the cluster's formation (30 s).
	ReadyTimeout time.Duration
	// Logf receives the harness's own notes (nil: none).
	Logf func(format string, args ...any)
	// Site adds a site (deploy/README.md, "Sites"; issue 36): a nats-server
	// leaf node in JetStream domain SiteDomain that joins the cluster, whose
	// nodes then run JetStream in domain HubDomain and listen for leaf
	// connections. The site's link to each node passes through a proxy
	// (SiteLinks), and the site's processes (ProcessSpec.AtSite) connect to
	// the site only.
	Site bool
}

// The JetStream domains of a cluster with a site (ClusterConfig.Site): a
// site's workers run with --js-domain HubDomain.
const (
	HubDomain  = "hub"
	SiteDomain = "site"
)

// Cluster is a JetStream cluster of nats-server processes on loopback whose
// routes all pass through proxies: node i reaches node j only through the
// proxy "ni>nj", so any route can be dropped, delayed or cut. Clients reach
// nodes through Endpoints, one proxy per client and node. Nodes advertise
// neither their client ports (no_advertise) nor their route ports (gossip
// names a sink that refuses), so no connection can go around a proxy.
type Cluster struct {
	cfg    ClusterConfig
	nodes  []*Node
	routes map[[2]int]*Proxy // [from, to]
	sink   net.Listener

	// site is the site's leaf node and siteLinks its links to each node
	// (by node index), when ClusterConfig.Site is set.
	site      *Node
	siteLinks []*Proxy

	mu        sync.Mutex
	endpoints []*Endpoint
	procs     []*Process
	closed    bool
}

// Node is one nats-server of the cluster. Its ports and store stay the same
// across restarts.
type Node struct {
	c           *Cluster
	Index       int
	Name        string
	ClientPort  int
	ClusterPort int
	HTTPPort    int
	// LeafPort is where a node listens for the site's links (0: no site).
	LeafPort   int
	StoreDir   string
	SyncAlways bool
	confPath   string
	logPath    string

	mu   sync.Mutex
	proc *osProc
	// stopped is set while the process is paused with SIGSTOP.
	stopped bool
}

// StartCluster writes the node configs, starts every node and waits until
// the JetStream meta group has a leader that knows every peer.
//
// The nodes' ports are taken free from the OS and released before the nodes
// bind them, so another process may take one in between: a start whose node
// exits on "address already in use" is tried again on fresh ports, up to
// startPortAttempts times.
func StartCluster(ctx context.Context, cfg ClusterConfig) (*Cluster, error) {
	for attempt := 1; ; attempt++ {
		c, err := startCluster(ctx, cfg)
		if err == nil || !errors.Is(err, errPortTaken) || attempt == startPortAttempts {
			return c, err
		}
		if cfg.Logf != nil {
			cfg.Logf("chaos: %v; starting the cluster again on other ports", err)
		}
		for i := 0; i < max(cfg.Nodes, 3); i++ {
			name := fmt.Sprintf("n%d", i+1)
			if err := os.RemoveAll(filepath.Join(cfg.Dir, name)); err != nil {
				return nil, err
			}
			if err := os.RemoveAll(filepath.Join(cfg.Dir, "logs", name+".log")); err != nil {
				return nil, err
			}
		}
	}
}

// startPortAttempts bounds StartCluster's starts on fresh ports when another
// process took a port between freePorts and the node's bind.
const startPortAttempts = 3

// errPortTaken marks a node that exited at start because a port of its was
// in use.
var errPortTaken = errors.New("a port was taken by another process")

func startCluster(ctx context.Context, cfg ClusterConfig) (*Cluster, error) {
	if cfg.Dir == "" || len(cfg.ServerCommand) == 0 {
		return nil, errors.New("chaos: ClusterConfig.Dir and ServerCommand are required")
	}
	if cfg.Nodes <= 0 {
		cfg.Nodes = 3
	}
	if cfg.Name == "" {
		cfg.Name = "brood-chaos"
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "logs"), 0o755); err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, routes: map[[2]int]*Proxy{}}
	var err error
	if c.sink, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, err
	}
	go refuseAll(c.sink)
	always := map[int]bool{}
	for _, i := range cfg.SyncAlways {
		always[i] = true
	}
	ports, err := pickPorts(4*cfg.Nodes + 2)
	if err != nil {
		c.Close()
		return nil, err
	}
	for i := 0; i < cfg.Nodes; i++ {
		n := &Node{
			c: c, Index: i, Name: fmt.Sprintf("n%d", i+1),
			ClientPort: ports[3*i], ClusterPort: ports[3*i+1], HTTPPort: ports[3*i+2],
			SyncAlways: always[i],
		}
		if cfg.Site {
			n.LeafPort = ports[3*cfg.Nodes+i]
		}
		n.StoreDir = filepath.Join(cfg.Dir, n.Name, "jetstream")
		n.confPath = filepath.Join(cfg.Dir, n.Name, "nats.conf")
		n.logPath = filepath.Join(cfg.Dir, "logs", n.Name+".log")
		c.nodes = append(c.nodes, n)
	}
	for _, from := range c.nodes {
		for _, to := range c.nodes {
			if from == to {
				continue
			}
			p, err := NewProxy(from.Name+">"+to.Name, net.JoinHostPort("127.0.0.1", strconv.Itoa(to.ClusterPort)))
			if err != nil {
				c.Close()
				return nil, err
			}
			c.routes[[2]int{from.Index, to.Index}] = p
		}
	}
	if cfg.Site {
		c.site = &Node{c: c, Index: -1, Name: "site", ClientPort: ports[4*cfg.Nodes], HTTPPort: ports[4*cfg.Nodes+1]}
		c.site.StoreDir = filepath.Join(cfg.Dir, c.site.Name, "jetstream")
		c.site.confPath = filepath.Join(cfg.Dir, c.site.Name, "nats.conf")
		c.site.logPath = filepath.Join(cfg.Dir, "logs", c.site.Name+".log")
		for _, n := range c.nodes {
			p, err := NewProxy("site>"+n.Name, net.JoinHostPort("127.0.0.1", strconv.Itoa(n.LeafPort)))
			if err != nil {
				c.Close()
				return nil, err
			}
			c.siteLinks = append(c.siteLinks, p)
		}
	}
	for _, n := range c.nodes {
		if err := n.writeConfig(); err != nil {
			c.Close()
			return nil, err
		}
	}
	if c.site != nil {
		if err := c.site.writeSiteConfig(); err != nil {
			c.Close()
			return nil, err
		}
	}
	for _, n := range c.nodes {
		if err := n.startProc(); err != nil {
			c.Close()
			return nil, err
		}
	}
	rctx, cancel := context.WithTimeout(ctx, cfg.ReadyTimeout)
	defer cancel()
	for _, n := range c.nodes {
		if err := n.waitReady(rctx); err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := c.WaitMetaLeader(rctx); err != nil {
		c.Close()
		return nil, err
	}
	if c.site != nil {
		if err := c.site.startProc(); err != nil {
			c.Close()
			return nil, err
		}
		if err := c.site.waitReady(rctx); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Site is the site's leaf node (nil without ClusterConfig.Site). The
// nemesis never kills it: the faults of a site are its links'.
func (c *Cluster) Site() *Node { return c.site }

// SetSiteLinks sets every link of the site to the cluster's nodes: a cut
// or a drop of the site, or latency on its links.
func (c *Cluster) SetSiteLinks(mode LinkMode, delay time.Duration) {
	for _, p := range c.siteLinks {
		p.Set(mode, delay)
	}
	if len(c.siteLinks) > 0 {
		c.logf("site links %s %s", mode, delay)
	}
}

func (c *Cluster) logf(format string, args ...any) {
	if c.cfg.Logf != nil {
		c.cfg.Logf(format, args...)
	}
}

// Nodes returns the cluster's nodes.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Node returns node i (0-based).
func (c *Cluster) Node(i int) *Node { return c.nodes[i] }

// NodeByName returns the node called name ("n1"...), or nil.
func (c *Cluster) NodeByName(name string) *Node {
	for _, n := range c.nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Dir is the cluster's working directory.
func (c *Cluster) Dir() string { return c.cfg.Dir }

// Route returns the proxy that node from uses to reach node to.
func (c *Cluster) Route(from, to int) *Proxy { return c.routes[[2]int{from, to}] }

// SetLink sets both directions of the route between nodes a and b.
func (c *Cluster) SetLink(a, b int, mode LinkMode, delay time.Duration) {
	c.Route(a, b).Set(mode, delay)
	c.Route(b, a).Set(mode, delay)
}

// Partition splits the nodes into the given groups: every route between two
// groups takes mode (Drop or Cut); routes inside a group pass. Nodes named in
// no group form a group of their own each.
func (c *Cluster) Partition(mode LinkMode, groups ...[]int) {
	group := map[int]int{}
	for g, members := range groups {
		for _, i := range members {
			group[i] = g
		}
	}
	for i := range c.nodes {
		if _, ok := group[i]; !ok {
			group[i] = len(groups) + i
		}
	}
	for key, p := range c.routes {
		if group[key[0]] == group[key[1]] {
			p.Heal()
		} else {
			p.Set(mode, 0)
		}
	}
	c.logf("partition %s: %v", mode, groups)
}

// Isolate cuts node i's routes to every other node (mode Drop or Cut).
func (c *Cluster) Isolate(i int, mode LinkMode) {
	var others []int
	for j := range c.nodes {
		if j != i {
			others = append(others, j)
		}
	}
	c.Partition(mode, []int{i}, others)
}

// Unreachable isolates node i from the other nodes and from every client
// (mode Drop or Cut): with Cut, clients reconnect to the other nodes; with
// Drop they learn nothing until their own timeouts.
func (c *Cluster) Unreachable(i int, mode LinkMode) {
	c.Isolate(i, mode)
	c.mu.Lock()
	eps := append([]*Endpoint(nil), c.endpoints...)
	c.mu.Unlock()
	for _, e := range eps {
		e.SetNode(i, mode, 0)
	}
	if len(c.siteLinks) > i {
		c.siteLinks[i].Set(mode, 0)
	}
	c.logf("node %s unreachable (%s)", c.nodes[i].Name, mode)
}

// HealRoutes lets every route pass again, without delay.
func (c *Cluster) HealRoutes() {
	for _, p := range c.routes {
		p.Heal()
	}
}

// DelayRoutes adds one-way latency d to every route.
func (c *Cluster) DelayRoutes(d time.Duration) {
	for _, p := range c.routes {
		p.Set(Pass, d)
	}
}

// HealAll heals every route, every client link of every endpoint and the
// site's links.
func (c *Cluster) HealAll() {
	c.HealRoutes()
	c.SetSiteLinks(Pass, 0)
	c.mu.Lock()
	eps := append([]*Endpoint(nil), c.endpoints...)
	c.mu.Unlock()
	for _, e := range eps {
		e.Heal()
	}
}

// Close kills every process and node and closes every proxy.
func (c *Cluster) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	procs := append([]*Process(nil), c.procs...)
	eps := append([]*Endpoint(nil), c.endpoints...)
	c.mu.Unlock()
	for _, p := range procs {
		p.Kill()
	}
	if c.site != nil {
		c.site.Kill()
	}
	for _, n := range c.nodes {
		n.Kill()
	}
	for _, p := range c.routes {
		p.Close()
	}
	for _, p := range c.siteLinks {
		p.Close()
	}
	for _, e := range eps {
		e.close()
	}
	if c.sink != nil {
		_ = c.sink.Close()
	}
}

// refuseAll accepts and at once closes every connection: the address nodes
// gossip as their route URL, so an implicit route never bypasses a proxy.
func refuseAll(l net.Listener) {
	for {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		_ = conn.Close()
	}
}

// freePorts reserves n distinct free loopback ports.
// pickPorts is freePorts; a test replaces it to hand out a taken port.
var pickPorts = freePorts

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// nodeConfTemplate is a node's config: deploy/nats/cluster/node-N.conf's
// settings (max payload, JetStream limits, sync interval stated) without its
// accounts, with every listener on loopback and every route through a proxy.
const nodeConfTemplate = `# Written by the chaos harness (pkg/chaos).
server_name: %[1]s
listen: 127.0.0.1:%[2]d
http: 127.0.0.1:%[3]d
max_payload: 1MiB

jetstream {
  store_dir: %[4]q
  max_memory_store: 256MiB
  max_file_store: 10GiB
  sync_interval: %[5]s
%[10]s}

cluster {
  name: %[6]s
  listen: 127.0.0.1:%[7]d
  # Gossip names a sink that refuses, and clients learn no other URL, so
  # every connection goes through the harness's proxies.
  advertise: %[8]q
  no_advertise: true
  routes: [
%[9]s  ]
}
%[11]s`

// siteConfTemplate is the site's leaf node: deploy/nats/site/site1.conf's
// settings without its accounts, in its own JetStream domain, with one
// remote whose URLs are the site's links (proxies) to every node.
const siteConfTemplate = `# Written by the chaos harness (pkg/chaos).
server_name: %[1]s
listen: 127.0.0.1:%[2]d
http: 127.0.0.1:%[3]d
max_payload: 1MiB

jetstream {
  domain: %[4]s
  store_dir: %[5]q
  max_memory_store: 256MiB
  max_file_store: 10GiB
  sync_interval: "2m"
}

leafnodes {
  reconnect: "1s"
  remotes: [
    { urls: [ %[6]s ] }
  ]
}
`

// writeSiteConfig writes the site's config.
func (n *Node) writeSiteConfig() error {
	if err := os.MkdirAll(filepath.Dir(n.confPath), 0o755); err != nil {
		return err
	}
	var urls []string
	for _, p := range n.c.siteLinks {
		urls = append(urls, strconv.Quote("nats-leaf://"+p.Addr()))
	}
	conf := fmt.Sprintf(siteConfTemplate, n.Name, n.ClientPort, n.HTTPPort, SiteDomain, n.StoreDir, strings.Join(urls, ", "))
	return os.WriteFile(n.confPath, []byte(conf), 0o644)
}

func (n *Node) writeConfig() error {
	if err := os.MkdirAll(filepath.Dir(n.confPath), 0o755); err != nil {
		return err
	}
	var routes strings.Builder
	for _, to := range n.c.nodes {
		if to == n {
			continue
		}
		fmt.Fprintf(&routes, "    nats-route://%s\n", n.c.Route(n.Index, to.Index).Addr())
	}
	sync := `"2m"`
	if n.SyncAlways {
		sync = "always"
	}
	// With a site: the hub's JetStream domain, and a leafnodes listener
	// that does not tell the site the other nodes' (its links go through
	// the harness's proxies).
	domain, leaf := "", ""
	if n.LeafPort > 0 {
		domain = "  domain: " + HubDomain + "\n"
		leaf = fmt.Sprintf("\nleafnodes {\n  listen: 127.0.0.1:%d\n  no_advertise: true\n}\n", n.LeafPort)
	}
	conf := fmt.Sprintf(nodeConfTemplate, n.Name, n.ClientPort, n.HTTPPort, n.StoreDir, sync,
		n.c.cfg.Name, n.ClusterPort, n.c.sink.Addr().String(), routes.String(), domain, leaf)
	return os.WriteFile(n.confPath, []byte(conf), 0o644)
}

func (n *Node) startProc() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc != nil && !n.proc.exited() {
		return fmt.Errorf("chaos: node %s is running", n.Name)
	}
	cmd := n.c.cfg.ServerCommand
	args := append(append([]string(nil), cmd[1:]...), n.confPath)
	p, err := startProc(cmd[0], args, nil, n.logPath, "start "+n.Name)
	if err != nil {
		return err
	}
	n.proc, n.stopped = p, false
	return nil
}

// ClientAddr is the node's own client address (for the harness; clients of
// the system under test connect through an Endpoint).
func (n *Node) ClientAddr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.ClientPort)) }

// ClientURL is nats://ClientAddr.
func (n *Node) ClientURL() string { return "nats://" + n.ClientAddr() }

// Running reports whether the node's process is alive (paused counts).
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc != nil && !n.proc.exited()
}

// Paused reports whether the node is stopped with SIGSTOP.
func (n *Node) Paused() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stopped
}

// Kill sends SIGKILL and waits for the process to end (kill -9: nothing is
// flushed that the OS did not already have).
func (n *Node) Kill() {
	n.mu.Lock()
	p := n.proc
	n.stopped = false
	n.mu.Unlock()
	if p != nil {
		p.kill()
	}
	n.c.logf("node %s killed", n.Name)
}

// Restart starts a killed node again on the same ports and store and waits
// until it serves clients with JetStream enabled.
func (n *Node) Restart(ctx context.Context) error {
	if err := n.startProc(); err != nil {
		return err
	}
	n.c.logf("node %s restarted", n.Name)
	rctx, cancel := context.WithTimeout(ctx, n.c.cfg.ReadyTimeout)
	defer cancel()
	return n.waitReady(rctx)
}

// Pause stops the node's process with SIGSTOP; Resume continues it.
func (n *Node) Pause() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc == nil {
		return errors.New("chaos: node not started")
	}
	n.stopped = true
	return n.proc.signal(syscall.SIGSTOP)
}

// Resume continues a node paused with Pause.
func (n *Node) Resume() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc == nil {
		return errors.New("chaos: node not started")
	}
	n.stopped = false
	return n.proc.signal(syscall.SIGCONT)
}

// waitReady polls the node's health endpoint until JetStream is enabled.
func (n *Node) waitReady(ctx context.Context) error {
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz?js-server-only=true", n.HTTPPort)
	for {
		if n.proc.exited() {
			if logHas(n.logPath, "address already in use") {
				return fmt.Errorf("chaos: node %s exited during start: %w (see %s)", n.Name, errPortTaken, n.logPath)
			}
			return fmt.Errorf("chaos: node %s exited during start; see %s", n.Name, n.logPath)
		}
		if httpOK(ctx, url) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("chaos: node %s not ready: %w (see %s)", n.Name, ctx.Err(), n.logPath)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// logHas reports whether the log file at path contains text.
func logHas(path, text string) bool {
	b, err := os.ReadFile(path)
	return err == nil && bytes.Contains(b, []byte(text))
}

func httpOK(ctx context.Context, url string) bool {
	body, err := httpGet(ctx, url)
	return err == nil && body != nil
}

// httpGet returns the body of a 200 answer.
func httpGet(ctx context.Context, url string) ([]byte, error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return body, nil
}

// jsz is the part of a node's /jsz answer the harness reads.
type jsz struct {
	Meta *struct {
		Leader      string `json:"leader"`
		ClusterSize int    `json:"cluster_size"`
		Replicas    []struct {
			Name    string `json:"name"`
			Current bool   `json:"current"`
			Offline bool   `json:"offline"`
		} `json:"replicas"`
	} `json:"meta_cluster"`
	Accounts []struct {
		Streams []struct {
			Name    string `json:"name"`
			Cluster *struct {
				Leader   string `json:"leader"`
				Replicas []struct {
					Name    string `json:"name"`
					Current bool   `json:"current"`
					Offline bool   `json:"offline"`
				} `json:"replicas"`
			} `json:"cluster"`
		} `json:"stream_detail"`
	} `json:"account_details"`
}

func (n *Node) jsz(ctx context.Context) (jsz, error) {
	var z jsz
	body, err := httpGet(ctx, fmt.Sprintf("http://127.0.0.1:%d/jsz?accounts=true&streams=true", n.HTTPPort))
	if err != nil {
		return z, err
	}
	return z, json.Unmarshal(body, &z)
}

// WaitMetaLeader waits until a running node leads the JetStream meta group
// and sees every node as a current peer.
func (c *Cluster) WaitMetaLeader(ctx context.Context) error {
	for {
		for _, n := range c.nodes {
			if !n.Running() || n.Paused() {
				continue
			}
			z, err := n.jsz(ctx)
			if err != nil || z.Meta == nil || z.Meta.Leader != n.Name {
				continue
			}
			current := 1 // the leader itself
			for _, r := range z.Meta.Replicas {
				if r.Current && !r.Offline {
					current++
				}
			}
			if current == len(c.nodes) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("chaos: no JetStream meta leader with every peer current: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// StreamLeader returns the node that leads stream (a KV bucket's stream is
// "KV_<bucket>"): the running node that reports itself its leader. Nil when
// none does (an election is under way, or the stream does not exist).
func (c *Cluster) StreamLeader(ctx context.Context, stream string) *Node {
	for _, n := range c.nodes {
		if !n.Running() || n.Paused() {
			continue
		}
		z, err := n.jsz(ctx)
		if err != nil {
			continue
		}
		for _, a := range z.Accounts {
			for _, s := range a.Streams {
				if s.Name == stream && s.Cluster != nil && s.Cluster.Leader == n.Name {
					return n
				}
			}
		}
	}
	return nil
}

// StreamCurrent reports whether stream has a leader and every replica is
// current, as its leader sees it.
func (c *Cluster) StreamCurrent(ctx context.Context, stream string) bool {
	l := c.StreamLeader(ctx, stream)
	if l == nil {
		return false
	}
	z, err := l.jsz(ctx)
	if err != nil {
		return false
	}
	for _, a := range z.Accounts {
		for _, s := range a.Streams {
			if s.Name != stream || s.Cluster == nil {
				continue
			}
			for _, r := range s.Cluster.Replicas {
				if !r.Current || r.Offline {
					return false
				}
			}
			return true
		}
	}
	return false
}

// StepDown asks stream's leader to step down (JetStream API
// $JS.API.STREAM.LEADER.STEPDOWN.<stream>), through a connection of the
// harness's own to a running node.
func (c *Cluster) StepDown(ctx context.Context, stream string) error {
	var last error
	for _, n := range c.nodes {
		if !n.Running() || n.Paused() {
			continue
		}
		nc, err := nats.Connect(n.ClientURL(), nats.Timeout(2*time.Second), nats.MaxReconnects(0), nats.Name("chaos-harness"))
		if err != nil {
			last = err
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m, err := nc.RequestWithContext(rctx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, nil)
		cancel()
		nc.Close()
		if err != nil {
			last = err
			continue
		}
		var r struct {
			Success bool `json:"success"`
			Error   *struct {
				Description string `json:"description"`
			} `json:"error"`
		}
		if err := json.Unmarshal(m.Data, &r); err != nil {
			return err
		}
		if !r.Success {
			if r.Error != nil {
				return fmt.Errorf("chaos: step down %s: %s", stream, r.Error.Description)
			}
			return fmt.Errorf("chaos: step down %s refused", stream)
		}
		c.logf("stream %s leader stepped down", stream)
		return nil
	}
	return fmt.Errorf("chaos: step down %s: no node answered: %v", stream, last)
}
