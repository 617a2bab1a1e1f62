package deploy

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// TestTheCollectorCannotReOwnALiveTree (issue 29, item 3; docs/security.md,
// "A collector"): as collector, on deploy/'s cluster and permissions, purge
// a live root's header ($JS.API.STREAM.PURGE.BROOD_SESSIONS with the
// header's subject as filter, a right the collector has to remove what it
// collects) and publish it back naming another user (its right to put back
// the headers of a tree it stopped removing). After a coordinator restart
// (no header cached), the other user's own grant must not act on the tree:
// a coordinator takes a live root's header only when it is the one the
// root's lease (which only coordinators write) records.
func TestTheCollectorCannotReOwnALiveTree(t *testing.T) {
	setPasswords(t)
	servers := startServers(t, clusterOptions(t)...)
	waitMetaLeader(t, servers)
	var urls []string
	for _, s := range servers {
		urls = append(urls, s.ClientURL())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	subj := protocol.MustSubjects("")
	cfg := store.DefaultConfig()
	cfg.Replicas = 3
	admin := connectAs(t, urls[0], "admin", nil)
	if _, err := store.Provision(ctx, admin, subj, cfg); err != nil {
		t.Fatalf("provision as admin: %v", err)
	}
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	startCoordinator := func() func() {
		nc := connectAs(t, urls[0], "coordinator", nil)
		st, err := store.Open(ctx, nc, subj, openConfig(nc, cfg))
		if err != nil {
			t.Fatal(err)
		}
		c, err := coordinator.New(coordinator.Config{NC: nc, Store: st, HeartbeatInterval: stack.Heartbeat, HostExpiry: stack.HostExpiry, Logger: testutil.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		stop := testutil.Background(t, c)
		<-c.Ready()
		return stop
	}
	stop := startCoordinator()
	newClient := func(user string) *client.Client {
		cl, err := client.New(connectAs(t, urls[1], user, nil), client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	owner, other := newClient("client"), newClient("trusted-host")
	root := openRoot(ctx, t, owner) // renewed by its client: live throughout
	// The other user's own grant (minted on its own subject: its trees only).
	g, err := other.UserGrant(ctx)
	if err != nil || g.User != "trusted-host" {
		t.Fatalf("the other user's grant: %+v, %v", g, err)
	}
	readAsOther := func() error {
		_, err := other.Log(ctx, protocol.LogReadRequest{SessionID: root.SessionID, Authority: protocol.Authority{Grant: g.Grant}})
		return err
	}
	if err := readAsOther(); protocol.CodeOf(err) != protocol.CodeUnauthorized {
		t.Fatalf("the other user's grant on the tree before the attack: %v, want UNAUTHORIZED", err)
	}

	// The collector's attack.
	col := connectAs(t, urls[2], "collector", nil)
	sessions, err := js.Stream(ctx, "BROOD_SESSIONS")
	if err != nil {
		t.Fatal(err)
	}
	headerSubject := subj.Session(root.SessionID)
	m, err := sessions.GetLastMsgForSubject(ctx, headerSubject)
	if err != nil {
		t.Fatal(err)
	}
	var h protocol.SessionHeader
	if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &h); err != nil || h.User != "client" {
		t.Fatalf("the root's header: %+v, %v", h, err)
	}
	if err := jsRequest(ctx, col, "$JS.API.STREAM.PURGE.BROOD_SESSIONS", map[string]any{"filter": headerSubject}); err != nil {
		t.Fatalf("the collector's purge of a header (its right): %v", err)
	}
	h.User = "trusted-host"
	data, _ := protocol.Marshal(protocol.Msgpack, h)
	colJS, err := jetstream.New(col)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := colJS.PublishMsg(ctx, &nats.Msg{Subject: headerSubject, Data: data}); err != nil {
		t.Fatalf("the collector's put-back of a header (its right): %v", err)
	}

	stop()
	startCoordinator()
	if err := readAsOther(); err == nil {
		t.Fatal("after a coordinator restart the other user's grant acts on the re-owned tree")
	} else {
		t.Logf("refused: %v", err)
	}
	if _, err := root.Renew(ctx); err != nil {
		t.Logf("the owner's renewal of the tree whose header was forged: %v", err)
	}
}
