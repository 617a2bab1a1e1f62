package coordinator_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// missingHost is a hosts bucket whose watches never deliver the records of
// one host, as a watch opened again through an election of brood_hosts
// delivered a snapshot without the key; reads (the leader's answer) see
// them.
type missingHost struct {
	jetstream.KeyValue
	host string
}

func (m missingHost) WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	w, err := m.KeyValue.WatchAll(ctx, opts...)
	if err != nil {
		return nil, err
	}
	out := &filteredWatch{KeyWatcher: w, updates: make(chan jetstream.KeyValueEntry), stop: make(chan struct{})}
	go func() {
		defer close(out.updates)
		for e := range w.Updates() {
			if e != nil && e.Key() == m.host {
				continue
			}
			select {
			case out.updates <- e:
			case <-out.stop:
				return
			}
		}
	}()
	return out, nil
}

type filteredWatch struct {
	jetstream.KeyWatcher
	updates chan jetstream.KeyValueEntry
	stop    chan struct{}
	once    sync.Once
}

func (f *filteredWatch) Updates() <-chan jetstream.KeyValueEntry { return f.updates }

func (f *filteredWatch) Stop() error {
	f.once.Do(func() { close(f.stop) })
	return f.KeyWatcher.Stop()
}

// TestAHostIsLostOnlyOnItsLatestRecord (issue 16: HOST_LOST through an
// election of brood_hosts): a coordinator whose hosts watch never delivers
// a host's heartbeats (missingHost) judges the host dead from its registry,
// yet takes over none of its sessions and settles none of the runs it
// claimed while the host's record, read from the bucket's leader, keeps
// changing: a one-shot run under its lease and an epoch record it claimed
// without a lease yet stay running, with nothing written into their logs,
// for three host expiries. Once the host stops heartbeating, both are
// settled HOST_LOST (the loss is still judged, on a record read fresh). It
// failed before: both settled HOST_LOST one host expiry after the lease was
// first seen.
func TestAHostIsLostOnlyOnItsLatestRecord(t *testing.T) {
	const host = "spawn.heartbeating"
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) {
		st := *c.Store
		st.Hosts = missingHost{KeyValue: st.Hosts, host: store.HostKey(host)}
		c.Store = &st
		c.RequestBudget = time.Hour
	})
	root := s.Root()
	ctx, cancel := context.WithCancel(context.Background())
	beating := make(chan struct{})
	go func() {
		defer close(beating)
		started := store.NowMs()
		for ctx.Err() == nil {
			bctx, bcancel := context.WithTimeout(ctx, time.Second)
			_, _ = s.Store.PutHost(bctx, protocol.HostRecord{HostID: host, Kind: protocol.HostWorker, Providers: []protocol.ProviderDescriptor{},
				Heartbeat: store.NowMs(), StartedAt: started, HeartbeatMs: stack.Heartbeat.Milliseconds()})
			bcancel()
			select {
			case <-ctx.Done():
			case <-time.After(stack.Heartbeat):
			}
		}
	}()
	stopBeating := func() { cancel(); <-beating }
	defer stopBeating()

	openTurn := []protocol.SessionEvent{event(t, protocol.EvTurnStart, protocol.TurnData{Turn: 1})}
	leased, claimed := "hostlost-leased", "hostlost-claimed"
	putChild(t, s, root, leased, openTurn...)
	putChild(t, s, root, claimed)
	now := store.NowMs()
	putRun(t, s, protocol.RunRecord{RunID: "run-" + leased, ChildID: leased, ParentSession: root.SessionID, Provider: "spawn",
		Mode: protocol.ModeOneShot, State: protocol.RunRunning, CreatedAt: now, StartedAt: now, HostID: host})
	l := deadLease(root, leased, "run-"+leased, protocol.AgentOneShot, 0)
	l.HostID = host
	putLease(t, s, l)
	d := continuableDescriptor()
	putRun(t, s, protocol.RunRecord{RunID: "run-" + claimed, ChildID: claimed, ParentSession: root.SessionID, Provider: "spawn",
		Mode: protocol.ModeContinuable, State: protocol.RunRunning, CreatedAt: now, StartedAt: now, HostID: host, Descriptor: &d})

	for end := time.Now().Add(3 * stack.HostExpiry); time.Now().Before(end); time.Sleep(stack.Heartbeat) {
		for _, id := range []string{leased, claimed} {
			if r, err := runOf(s, "run-"+id); err != nil || r.State != protocol.RunRunning {
				t.Fatalf("run of %s while its host heartbeats: %+v, %v; want it running", id, r, err)
			}
			if _, evs := s.Log(id); fences(evs) != 0 || len(evs) > len(openTurn) {
				t.Fatalf("the log of %s was written while its host heartbeats: %+v", id, evs)
			}
		}
		if !leaseHeld(t, s, leased) {
			t.Fatalf("the lease of %s went while its host heartbeats", leased)
		}
	}
	stopBeating()
	for _, id := range []string{leased, claimed} {
		testutil.Eventually(t, 10*stack.HostExpiry, func() bool {
			r, err := runOf(s, "run-"+id)
			return err == nil && r.State == protocol.RunSettled && r.Result != nil && r.Result.ErrorCode == protocol.CodeHostLost
		}, "run of %s settled HOST_LOST once its host stopped", id)
	}
}
