package testutil

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/brood-dev/brood/internal/embedded"
)

// Cluster is a JetStream cluster of nats-servers inside the test process,
// every listener on 127.0.0.1. A node can be stopped and started again on its
// own store and ports, which moves the leadership of every stream and bucket
// it led to another node (a leader election). Nodes stop at the end of the
// test.
type Cluster struct {
	t     testing.TB
	mu    sync.Mutex
	opts  []*server.Options
	nodes []*server.Server // nil while stopped
}

// NewCluster starts n nodes without authentication (global account) on free
// loopback ports and waits for a JetStream meta leader that knows every node.
func NewCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartCluster(t, clusterOptions(t, n))
}

// NewClusterPartly is a fresh n-node cluster of which only the first started
// nodes run (and accept clients); the others were never started, so no
// node has heard of them: an R3 placement is refused with "no suitable peers
// for placement" (10005) until Restart(i) starts them. It does not wait for
// a meta leader.
func NewClusterPartly(t testing.TB, n, started int) *Cluster {
	t.Helper()
	c := newCluster(t, clusterOptions(t, n))
	for i := 0; i < started; i++ {
		c.launch(i)
	}
	for i := 0; i < started; i++ {
		c.waitReady(i)
	}
	return c
}

// clusterOptions are the options of n routed nodes on free loopback ports.
func clusterOptions(t testing.TB, n int) []*server.Options {
	t.Helper()
	ports := make([]int, 2*n)
	for i := range ports {
		p, err := embedded.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = p
	}
	opts := make([]*server.Options, n)
	for i := range opts {
		var routes []*url.URL
		for j := 0; j < n; j++ {
			if j != i {
				routes = append(routes, &url.URL{Scheme: "nats-route", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[n+j]))})
			}
		}
		opts[i] = &server.Options{
			ServerName: fmt.Sprintf("node-%d", i+1),
			Host:       "127.0.0.1", Port: ports[i],
			JetStream: true, JetStreamMaxMemory: -1, JetStreamMaxStore: -1,
			MaxPayload: embedded.DefaultMaxPayloadBytes,
			Cluster:    server.ClusterOpts{Name: "brood-test", Host: "127.0.0.1", Port: ports[n+i]},
			Routes:     routes,
		}
	}
	return opts
}

// StartCluster starts nodes from processed options (deploy/nats/cluster, or
// NewCluster's): each without its own signal handling or log, on a temp
// store directory unless one is set. It waits for a meta leader.
func StartCluster(t testing.TB, opts []*server.Options) *Cluster {
	t.Helper()
	c := newCluster(t, opts)
	for i := range opts {
		c.launch(i)
	}
	for i := range opts {
		c.waitReady(i)
	}
	c.WaitMetaLeader()
	return c
}

// newCluster prepares opts (a temp store directory unless set, no signal
// handling, no log) and stops every node when the test ends.
func newCluster(t testing.TB, opts []*server.Options) *Cluster {
	t.Helper()
	c := &Cluster{t: t, opts: opts, nodes: make([]*server.Server, len(opts))}
	for _, o := range opts {
		if o.StoreDir == "" {
			o.StoreDir = t.TempDir()
		}
		o.NoSigs, o.NoLog = true, true
	}
	t.Cleanup(func() {
		for i := range c.opts {
			c.Stop(i)
		}
	})
	return c
}

func (c *Cluster) launch(i int) {
	c.t.Helper()
	s, err := server.NewServer(c.opts[i])
	if err != nil {
		c.t.Fatalf("%s: %v", c.opts[i].ServerName, err)
	}
	c.mu.Lock()
	c.nodes[i] = s
	c.mu.Unlock()
	go s.Start()
}

// NodeReadyWait bounds a node's start until it accepts clients: a restarted
// node recovers its JetStream streams before it listens for clients and
// routes, which under -race on a loaded machine can take seconds.
const NodeReadyWait = 30 * time.Second

func (c *Cluster) waitReady(i int) {
	c.t.Helper()
	s := c.Node(i)
	if s != nil && s.ReadyForConnections(NodeReadyWait) {
		return
	}
	// Which listeners are up tells a port taken by another socket (Start
	// gives up at the first listener it cannot open, silently with NoLog)
	// from a start still under way (JetStream's recovery comes after the
	// monitoring listener and before the route and client listeners).
	var monitoring, routes, clients any
	if s != nil {
		monitoring, routes, clients = s.MonitorAddr(), s.ClusterAddr(), s.Addr()
	}
	c.t.Fatalf("%s not accepting clients after %s (listening: monitoring %v, routes %v, clients %v; ports %d, %d, %d)",
		c.opts[i].ServerName, NodeReadyWait, monitoring, routes, clients, c.opts[i].HTTPPort, c.opts[i].Cluster.Port, c.opts[i].Port)
}

// Node is node i (nil while stopped).
func (c *Cluster) Node(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// Size is the number of nodes, running or not.
func (c *Cluster) Size() int { return len(c.opts) }

// URL is node i's client URL.
func (c *Cluster) URL(i int) string {
	return "nats://" + net.JoinHostPort(c.opts[i].Host, strconv.Itoa(c.opts[i].Port))
}

// URLs lists every node's client URL, comma-separated (what nats.Connect takes).
func (c *Cluster) URLs() string {
	out := make([]string, len(c.opts))
	for i := range c.opts {
		out[i] = c.URL(i)
	}
	return strings.Join(out, ",")
}

// Stop shuts node i down (its clients reconnect to the other nodes; the
// streams it led elect new leaders). Stopping a stopped node does nothing;
// an index that names no node fails the test before the cluster's lock is
// taken (an index out of range panicked under the lock, and the cleanup
// that stops every node then hung on it).
func (c *Cluster) Stop(i int) {
	if i < 0 || i >= len(c.opts) {
		c.t.Fatalf("Stop(%d): the cluster has nodes 0 to %d", i, len(c.opts)-1)
	}
	c.mu.Lock()
	s := c.nodes[i]
	c.nodes[i] = nil
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// Restart starts a stopped (or never started) node again on its store
// directory and ports.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	if c.Node(i) != nil {
		c.t.Fatalf("node %d is running", i)
	}
	c.launch(i)
	c.waitReady(i)
}

// WaitMetaLeader waits until a running node leads the JetStream meta group
// and knows every node as a peer (until then an R3 stream cannot be placed).
func (c *Cluster) WaitMetaLeader() {
	c.t.Helper()
	Eventually(c.t, 20*time.Second, func() bool {
		for i := range c.opts {
			if s := c.Node(i); s != nil && s.JetStreamIsLeader() {
				return len(s.JetStreamClusterPeers()) == len(c.opts)
			}
		}
		return false
	}, "a JetStream meta leader with every peer")
}

// StreamLeader is the index of the running node that leads stream (a KV
// bucket's stream is KV_<bucket>) in account (server.DEFAULT_GLOBAL_ACCOUNT
// without authentication), or -1 while none does.
func (c *Cluster) StreamLeader(account, stream string) int {
	for i := range c.opts {
		if s := c.Node(i); s != nil && s.JetStreamIsStreamLeader(account, stream) {
			return i
		}
	}
	return -1
}

// replicaHeardWithin is how recently a stream's leader must have heard from
// a replica to count it current.
const replicaHeardWithin = 2 * time.Second

// streamCurrentWait bounds WaitStreamCurrent.
const streamCurrentWait = 60 * time.Second

// WaitStreamCurrent waits until the cluster has caught up (after a restart,
// before stopping another node): a meta leader that knows every node and
// counts each running one current, and, for each stream, a leader whose own
// view (JszAccount with StreamLeaderOnly) has every replica on a running
// node current, not offline, and heard from within replicaHeardWithin.
// Asking each node whether it is current is not enough: nats-server's raft
// counts a replica current while it knows no leader yet, so a node restarted
// a moment ago reads current before it has caught up, and stopping the next
// node then leaves a stream without a quorum (deploy's election test, issue
// 37, item 9).
func (c *Cluster) WaitStreamCurrent(account string, streams ...string) {
	c.t.Helper()
	var behind string
	Eventually(c.t, streamCurrentWait, func() bool {
		behind = c.notCaughtUp(account, streams)
		return behind == ""
	}, "streams %v led and current on every running node (last: %s)", streams, lazy(func() string { return behind }))
}

// lazy is a string formatted when printed (what a wait last saw, in its failure).
type lazy func() string

func (l lazy) String() string { return l() }

// notCaughtUp says what WaitStreamCurrent still waits for ("" for nothing).
func (c *Cluster) notCaughtUp(account string, streams []string) string {
	running := map[string]bool{}
	for i := range c.opts {
		if c.Node(i) != nil {
			running[c.opts[i].ServerName] = true
		}
	}
	meta := "no meta leader"
	for i := range c.opts {
		s := c.Node(i)
		if s == nil || !s.JetStreamIsLeader() {
			continue
		}
		if n := len(s.JetStreamClusterPeers()); n != len(c.opts) {
			return fmt.Sprintf("the meta leader knows %d of %d nodes", n, len(c.opts))
		}
		jsi, err := s.Jsz(&server.JSzOptions{})
		if err != nil || jsi.Meta == nil {
			return fmt.Sprintf("the meta leader's view: %v", err)
		}
		if why := replicasBehind(jsi.Meta.Replicas, running); why != "" {
			return "meta: " + why
		}
		meta = ""
	}
	if meta != "" {
		return meta
	}
	for _, st := range streams {
		leader := c.StreamLeader(account, st)
		if leader < 0 {
			return st + " has no leader"
		}
		s := c.Node(leader)
		if s == nil {
			return st + "'s leader stopped"
		}
		ad, err := s.JszAccount(&server.JSzOptions{Account: account, Streams: true, StreamLeaderOnly: true})
		if err != nil {
			return fmt.Sprintf("%s's leader's view: %v", st, err)
		}
		found := false
		for _, d := range ad.Streams {
			if d.Name != st {
				continue
			}
			found = true
			if d.Cluster == nil {
				return st + " has no cluster view yet"
			}
			if why := replicasBehind(d.Cluster.Replicas, running); why != "" {
				return st + ": " + why
			}
		}
		if !found {
			return st + " is not in its leader's view"
		}
	}
	return ""
}

// replicasBehind says which replica on a running node is not caught up
// ("" when every one is).
func replicasBehind(replicas []*server.PeerInfo, running map[string]bool) string {
	for _, r := range replicas {
		if !running[r.Name] {
			continue
		}
		if !r.Current || r.Offline || r.Active > replicaHeardWithin {
			return fmt.Sprintf("replica %s current %v offline %v last heard %s ago, lag %d", r.Name, r.Current, r.Offline, r.Active, r.Lag)
		}
	}
	return ""
}
