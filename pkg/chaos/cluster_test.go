package chaos

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

// broodBin is the brood binary built once for the package's tests;
// broodRaceBin the same with the race detector (-chaos.race only).
var broodBin, broodRaceBin string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "brood-chaos-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	broodBin, err = Build(context.Background(), dir)
	if err == nil && *chaosRace {
		// The services' binary with the race detector (the nodes keep the
		// plain one): a data race a fault provokes ends the run.
		raceDir := filepath.Join(dir, "race")
		if err = os.MkdirAll(raceDir, 0o755); err == nil {
			broodRaceBin, err = Build(context.Background(), raceDir, "-race")
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	// Proxies, recorders and process watchers all end with their test.
	if err := goleak.Find(); err != nil && code == 0 {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		code = 1
	}
	os.Exit(code)
}

// testCluster starts a 3-node cluster for one test, node 3 with sync always.
func testCluster(t *testing.T) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := StartCluster(ctx, ClusterConfig{Dir: t.TempDir(), ServerCommand: ServerCommand(broodBin), SyncAlways: []int{2}, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// eventually polls cond until it holds or total passed.
func eventually(t *testing.T, total time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(total)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", total, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func connectEndpoint(t *testing.T, e *Endpoint, first int) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(e.URLs(first), nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.Timeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

func publishOK(ctx context.Context, js jetstream.JetStream, subj string) bool {
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := js.Publish(pctx, subj, []byte("x"))
	return err == nil
}

// TestClusterFaults runs the fault primitives the chaos schedule uses on a
// bare cluster: an R3 stream keeps accepting writes through a kill -9 of its
// leader, a stepdown and the isolation of a node; an isolated node has no
// route left (no connection goes around the proxies); a client cut from its
// node reconnects to another.
func TestClusterFaults(t *testing.T) {
	c := testCluster(t)
	ctx := context.Background()
	if cfg, err := os.ReadFile(c.Node(2).confPath); err != nil || !strings.Contains(string(cfg), "sync_interval: always") {
		t.Fatalf("node 3 config lacks sync_interval: always: %v", err)
	}
	app, err := c.NewEndpoint("app")
	if err != nil {
		t.Fatal(err)
	}
	nc, js := connectEndpoint(t, app, 0)
	// A meta leader may not see every peer current yet ("no suitable peers
	// for placement"): placement is retried until all three are.
	var createErr error
	eventually(t, 60*time.Second, "stream T created on three peers", func() bool {
		_, createErr = js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t"}, Replicas: 3, Storage: jetstream.FileStorage})
		return createErr == nil
	})
	eventually(t, 60*time.Second, "stream T current on all replicas", func() bool { return c.StreamCurrent(ctx, "T") })

	t.Run("kill -9 of the stream leader", func(t *testing.T) {
		leader := c.StreamLeader(ctx, "T")
		leader.Kill()
		eventually(t, 60*time.Second, "writes accepted without the killed leader", func() bool { return publishOK(ctx, js, "t") })
		if l := c.StreamLeader(ctx, "T"); l == leader {
			t.Fatalf("the killed node %s still leads", leader.Name)
		}
		if err := leader.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "stream T current again", func() bool { return c.StreamCurrent(ctx, "T") })
	})

	t.Run("stepdown", func(t *testing.T) {
		before := c.StreamLeader(ctx, "T")
		if err := c.StepDown(ctx, "T"); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "a new leader", func() bool {
			l := c.StreamLeader(ctx, "T")
			return l != nil && l != before
		})
		eventually(t, 60*time.Second, "writes accepted", func() bool { return publishOK(ctx, js, "t") })
	})

	t.Run("isolated node", func(t *testing.T) {
		victim := c.StreamLeader(ctx, "T")
		c.Isolate(victim.Index, Cut)
		eventually(t, 60*time.Second, "the isolated node has no route", func() bool {
			z, err := httpGet(ctx, fmt.Sprintf("http://127.0.0.1:%d/routez", victim.HTTPPort))
			return err == nil && strings.Contains(string(z), `"num_routes": 0`)
		})
		// A client that reaches only the majority writes.
		maj, err := c.NewEndpoint("majority")
		if err != nil {
			t.Fatal(err)
		}
		maj.SetNode(victim.Index, Cut, 0)
		_, mjs := connectEndpoint(t, maj, (victim.Index+1)%3)
		eventually(t, 60*time.Second, "the majority elects another leader and takes writes", func() bool {
			l := c.StreamLeader(ctx, "T")
			return l != nil && l != victim && publishOK(ctx, mjs, "t")
		})
		// A client that reaches only the isolated node cannot write.
		lone, err := c.NewEndpoint("lone")
		if err != nil {
			t.Fatal(err)
		}
		for i := range c.Nodes() {
			if i != victim.Index {
				lone.SetNode(i, Cut, 0)
			}
		}
		_, ljs := connectEndpoint(t, lone, victim.Index)
		if publishOK(ctx, ljs, "t") {
			t.Fatal("a write through the isolated node was acknowledged")
		}
		// Still isolated after a while: no connection went around the proxies.
		time.Sleep(2 * time.Second)
		if z, err := httpGet(ctx, fmt.Sprintf("http://127.0.0.1:%d/routez", victim.HTTPPort)); err != nil || !strings.Contains(string(z), `"num_routes": 0`) {
			t.Fatalf("the isolated node has routes again: %v\n%s", err, z)
		}
		c.HealRoutes()
		eventually(t, 60*time.Second, "stream T current after the heal", func() bool { return c.StreamCurrent(ctx, "T") })
		eventually(t, 60*time.Second, "a write through the healed node", func() bool { return publishOK(ctx, ljs, "t") })
	})

	t.Run("client cut from its server", func(t *testing.T) {
		on := app.Connected()
		if len(on) != 1 {
			t.Fatalf("the client has connections to nodes %v, want one", on)
		}
		app.SetNode(on[0], Cut, 0)
		eventually(t, 60*time.Second, "the client reconnects to another node", func() bool {
			now := app.Connected()
			return nc.IsConnected() && len(now) == 1 && now[0] != on[0]
		})
		if !publishOK(ctx, js, "t") {
			t.Fatal("no write after the reconnect")
		}
		app.Heal()
	})
}

// TestStartClusterTriesOtherPortsWhenOneIsTaken: a port freePorts handed out
// can be taken by another process before the node binds it (parallel test
// packages do); the start is tried again on fresh ports instead of failing
// with "node exited during start".
func TestStartClusterTriesOtherPortsWhenOneIsTaken(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	taken := held.Addr().(*net.TCPAddr).Port
	calls := 0
	pickPorts = func(n int) ([]int, error) {
		calls++
		ports, err := freePorts(n)
		if err == nil && calls == 1 {
			ports[0] = taken // node n1's client port, held by this test
		}
		return ports, err
	}
	t.Cleanup(func() { pickPorts = freePorts })
	c := testCluster(t)
	if calls < 2 {
		t.Fatalf("ports were picked %d time(s), want a second pick after the taken port", calls)
	}
	for _, n := range c.Nodes() {
		if n.ClientPort == taken || n.ClusterPort == taken || n.HTTPPort == taken {
			t.Fatalf("node %s runs on the taken port %d", n.Name, taken)
		}
		if !n.Running() {
			t.Fatalf("node %s is not running", n.Name)
		}
	}
}
