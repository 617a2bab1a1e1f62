package deploy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// singleNode starts one nats-server node on a free loopback port with the
// accounts, users and permissions of the cluster's accounts.conf, and
// returns its URL.
func singleNode(t *testing.T) string {
	t.Helper()
	setPasswords(t)
	dir := t.TempDir()
	accounts, err := os.ReadFile(filepath.Join(clusterDir, "accounts.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "accounts.conf"), accounts, 0o600); err != nil {
		t.Fatal(err)
	}
	conf := "server_name: single\nlisten: 127.0.0.1:-1\nmax_payload: 1MiB\njetstream { store_dir: " + strings.ReplaceAll(filepath.Join(dir, "js"), `\`, `/`) + " }\ninclude ./accounts.conf\n"
	path := filepath.Join(dir, "node.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	o := processConf(t, path)
	requireLoopback(t, o)
	o.NoSigs, o.NoLog = true, true
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("the single node is not accepting clients after 10s")
	}
	return s.ClientURL()
}

// openConfig is cfg as the service connected as nc's user opens the store
// with (cmd/brood's openStore): a worker user's only its provider's log
// and inbox streams and no root's (store.Config.Providers, SkipRoots),
// which are all its user may see; any other service's (a coordinator, the
// collector) the roots' only.
func openConfig(nc *nats.Conn, cfg store.Config) store.Config {
	if p, ok := strings.CutPrefix(nc.Opts.User, "worker-"); ok {
		cfg.Providers, cfg.SkipRoots = []string{p}, true
	} else {
		cfg.Providers = nil
	}
	return cfg
}

// TestAWorkerReadsALogPastALaggingReplica (issue 16: a worker's permission
// violation during an election): a session log read by a worker, as its
// own NATS user, whose direct gets are answered by a replica that lacks the
// log's last records (store.Faults.Lagging) reads them with what that user
// may do, and no read of a worker creates a consumer (only coordinators may;
// docs/security.md). It failed when the store fell back to an ordered
// consumer, refused to worker-spawn: the read ran out of its deadline, and
// the server reported the violation.
func TestAWorkerReadsALogPastALaggingReplica(t *testing.T) {
	url := singleNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v := &violations{}
	if _, err := store.Provision(ctx, connectAs(t, url, "admin", v), protocol.MustSubjects(""), store.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	nc := connectAs(t, url, "worker-spawn", v)
	st, err := store.Open(ctx, nc, protocol.MustSubjects(""), openConfig(nc, store.DefaultConfig()))
	if err != nil {
		t.Fatal(err)
	}
	const events = 40
	w := st.NewLogWriter("spawn", "child", 0, 0)
	for i := 0; i < events; i++ {
		ev, err := protocol.NewEvent(protocol.EvTurnStart, 1, protocol.TurnData{Turn: int64(i)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Append(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	current, err := st.ReadLog(ctx, "spawn", "child")
	if err != nil || len(current.Events) != events {
		t.Fatalf("read from a current replica: %d events, %v", len(current.Events), err)
	}
	lagging := st.WithFaults(store.Faults{Lagging: func(seq uint64) bool { return seq > current.LastSubjSeq-10 }})
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	got, err := lagging.ReadLog(rctx, "spawn", "child")
	if err != nil || len(got.Events) != events || got.LastSubjSeq != current.LastSubjSeq {
		t.Errorf("read past a lagging replica as worker-spawn: %d events, last %d (want %d, %d), %v", len(got.Events), got.LastSubjSeq, events, current.LastSubjSeq, err)
	}
	tail, _, err := lagging.ReadLogTail(rctx, "spawn", "child", func(evs []protocol.SessionEvent) bool { return len(evs) >= 5 })
	if err != nil || len(tail) < 5 || tail[len(tail)-1].Seq != events-1 {
		t.Errorf("tail past a lagging replica as worker-spawn: %d events, %v", len(tail), err)
	}
	if vs := v.list(); len(vs) > 0 {
		t.Errorf("permission violations:\n%s", strings.Join(vs, "\n"))
	}
}
