package deploy

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/pkg/protocol"
	spawnworker "github.com/brood-dev/brood/services/spawn-worker"
)

// sameProviderAttempts: a worker's reach over its own provider's other
// users (issue 29, item 7; docs/security.md, "What a compromised worker can
// do"). Every host of a provider runs as the provider's one NATS user, so
// each may subscribe to the host subjects of the others
// (brood.v1.host.<p>.*.*) and answer on their reply subjects
// (_INBOX.coordinator.host.<p>.>). Its answer to another host's dispose
// arrives first; what the coordinator tells the disposing client is read
// from the run's records, never taken from that answer.
func (f *forgery) sameProviderAttempts(t *testing.T) {
	v := &f.victim
	t.Run("answer another host's dispose first with a forged result", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		run, err := v.clientCl.StartRun(ctx, protocol.RunStartRequest{Parent: v.root.Ref(), Provider: spawnworker.DefaultName, Prompt: protocol.Text("sleep 60s\nsay late")})
		if err != nil {
			t.Fatal(err)
		}
		attacker := connectAs(t, f.urls[1], "worker-spawn", nil)
		var answered atomic.Int64
		forged := protocol.RunStatus{RunID: run.RunID, ChildID: run.ChildID, State: protocol.RunSettled,
			Result: &protocol.SubagentResult{Output: protocol.Text("forged result"), StopReason: protocol.StopCompleted}}
		data, _ := protocol.Marshal(protocol.Msgpack, forged)
		if _, err := attacker.Subscribe("brood.v1.host.spawn.*.dispose", func(m *nats.Msg) {
			reply := &nats.Msg{Subject: m.Reply, Data: data, Header: nats.Header{}}
			reply.Header.Set(protocol.HeaderContentType, protocol.Msgpack.ContentType())
			if attacker.PublishMsg(reply) == nil {
				answered.Add(1)
			}
		}); err != nil {
			t.Fatal(err)
		}
		if err := violationFor(attacker, "brood.v1.host.spawn.*.dispose"); err != nil {
			t.Fatalf("a spawn worker may watch every spawn host's requests (what remains): %v", err)
		}
		st, err := run.Dispose(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if answered.Load() == 0 {
			t.Fatal("the forged answer was never sent: the attempt proved nothing")
		}
		if st.State != protocol.RunSettled || st.Result == nil || strings.Contains(protocol.PlainText(st.Result.Output), "forged") {
			t.Fatalf("the disposing client was told %+v", st)
		}
		t.Logf("refused: the client got the run's record (%s, %q), not the forged answer", st.Result.StopReason, protocol.PlainText(st.Result.Output))
	})
}
