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
// streams it led elect new leaders). Stopping a stopped node does nothing.
func (c *Cluster) Stop(i int) {
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

// WaitStreamCurrent waits until every running node has a current replica of
// each stream (after a restart, before stopping another node).
func (c *Cluster) WaitStreamCurrent(account string, streams ...string) {
	c.t.Helper()
	Eventually(c.t, 30*time.Second, func() bool {
		for i := range c.opts {
			s := c.Node(i)
			if s == nil {
				continue
			}
			for _, st := range streams {
				if !s.JetStreamIsStreamCurrent(account, st) {
					return false
				}
			}
		}
		for _, st := range streams {
			if c.StreamLeader(account, st) < 0 {
				return false
			}
		}
		return true
	}, "streams %v led and current on every running node", streams)
}
