package store_test

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/brood-dev/brood/internal/embedded"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// startServer starts an embedded nats-server from o (loopback, random
// ports, a temp store) and stops it when the test ends.
func startServer(t *testing.T, o *server.Options) *server.Server {
	t.Helper()
	o.Host, o.Port, o.NoSigs, o.NoLog = "127.0.0.1", -1, true, true
	o.JetStream, o.StoreDir, o.MaxPayload = true, t.TempDir(), embedded.DefaultMaxPayloadBytes
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatalf("%s not ready", o.ServerName)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// hubAndSite is a hub server in JetStream domain hub and a leaf node in its
// own domain site connected to it (deploy/README.md, "Sites").
func hubAndSite(t *testing.T) (hub, site *server.Server) {
	t.Helper()
	port, err := embedded.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	hub = startServer(t, &server.Options{ServerName: "hub", JetStreamDomain: "hub",
		LeafNode: server.LeafNodeOpts{Host: "127.0.0.1", Port: port}})
	u, _ := url.Parse("nats-leaf://127.0.0.1:" + strconv.Itoa(port))
	site = startServer(t, &server.Options{ServerName: "site", JetStreamDomain: "site",
		LeafNode: server.LeafNodeOpts{Remotes: []*server.RemoteLeafOpts{{URLs: []*url.URL{u}}}}})
	testutil.Eventually(t, 10*time.Second, func() bool { return hub.NumLeafNodes() == 1 && site.NumLeafNodes() == 1 },
		"the site's leaf connection")
	return hub, site
}

// A store opened through a leaf node with the hub's JetStream domain
// (Config.JSDomain) reads and writes the hub's streams and buckets: fenced
// appends, KV compare-and-sets with their leader reads, direct gets, batch
// and last-messages gets, expiring deletes. Without the domain the plain
// API reaches the site's own JetStream, where nothing is provisioned
// (issue 36, item 1).
func TestAStoreThroughALeafNodeUsesTheHubsDomain(t *testing.T) {
	hub, site := hubAndSite(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	central := testutil.Store(t, testutil.Connect(t, hub.ClientURL()))
	leafNC := testutil.Connect(t, site.ClientURL())

	cfg := store.DefaultConfig()
	if _, err := store.Open(ctx, leafNC, central.Subj, cfg); !errors.Is(err, store.ErrNotProvisioned) {
		t.Fatalf("open through the leaf without a domain: %v, want ErrNotProvisioned (the site's own JetStream)", err)
	}
	cfg.JSDomain = "no such domain"
	if _, err := store.Open(ctx, leafNC, central.Subj, cfg); err == nil {
		t.Fatal("a domain that is no subject token was accepted")
	}
	cfg.JSDomain = "hub"
	st, err := store.Open(ctx, leafNC, central.Subj, cfg)
	if err != nil {
		t.Fatalf("open through the leaf with domain hub: %v", err)
	}

	// KV: a host record (put) and the listing of every host (a last-messages get).
	rec := protocol.HostRecord{HostID: "spawn.site-1", Providers: []protocol.ProviderDescriptor{{Name: "spawn"}}, StartedAt: store.NowMs()}
	if _, err := st.PutHost(ctx, rec); err != nil {
		t.Fatalf("put a host record through the leaf: %v", err)
	}
	for _, s := range []*store.Store{st, central} {
		hosts, err := s.HostRecords(ctx)
		if err != nil || len(hosts) != 1 || hosts[0].HostID != rec.HostID {
			t.Fatalf("host records: %+v, %v", hosts, err)
		}
	}

	// A run's claim and settlement (compare-and-sets, their leader reads) and
	// its reads (a direct get).
	run := protocol.RunRecord{RunID: "R1", ChildID: "C1", Provider: "spawn", Mode: protocol.ModeOneShot, State: protocol.RunRunning, CreatedAt: 1}
	created, err := central.CreateRun(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	claimed, claimRev, err := st.ClaimRun(ctx, run, created, rec.HostID)
	if err != nil {
		t.Fatalf("claim through the leaf: %v", err)
	}
	if _, _, err := st.ClaimRun(ctx, run, created, "spawn.other"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a second claim through the leaf: %v, want ErrConflict", err)
	}
	if got, err := st.RunOf(ctx, "spawn", "R1"); err != nil || got.Value.HostID != rec.HostID {
		t.Fatalf("read the claimed run through the leaf: %+v, %v", got, err)
	}
	res := protocol.SubagentResult{StopReason: protocol.StopCompleted, Output: protocol.Text("ok")}
	if won, err := st.SettleRun(ctx, store.Settled(claimed, rec.HostID, res), claimRev); !won || err != nil {
		t.Fatalf("settle through the leaf: %v, %v", won, err)
	}
	if got, err := central.RunLatestOf(ctx, "spawn", "R1"); err != nil || got.Value.State != protocol.RunSettled {
		t.Fatalf("the hub's run: %+v, %v", got, err)
	}

	// A session log: one fenced writer through the leaf, a second refused.
	w := st.NewLogWriter("spawn", "S1", 0, 0)
	if _, err := w.Append(ctx, event(t, 1)); err != nil {
		t.Fatalf("append through the leaf: %v", err)
	}
	if _, err := st.NewLogWriter("spawn", "S1", 0, 0).Append(ctx, event(t, 1)); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("a second writer through the leaf: %v, want ErrFenced", err)
	}
	if log, err := central.ReadLog(ctx, "spawn", "S1"); err != nil || len(log.Events) != 1 {
		t.Fatalf("the hub's log: %+v, %v", log, err)
	}

	// Batch gets and an expiring delete (its leader read and its publish).
	if err := st.PutClosedRoot(ctx, "ROOT1", 1); err != nil {
		t.Fatal(err)
	}
	closed, err := st.ClosedRoots(ctx, 10)
	if err != nil || len(closed) != 1 {
		t.Fatalf("closed roots through the leaf: %+v, %v", closed, err)
	}
	if err := st.DeleteClosedRoot(ctx, "ROOT1", closed[0].Revision); err != nil {
		t.Fatalf("delete through the leaf: %v", err)
	}
	if closed, err := central.ClosedRoots(ctx, 10); err != nil || len(closed) != 0 {
		t.Fatalf("the hub's closed roots after the delete: %+v, %v", closed, err)
	}
}
