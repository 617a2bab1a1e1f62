package testutil

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// ServeLeaderReads answers the worker hosts' leader reads
// (protocol.Subjects.KVLatest) from st, as a coordinator does, for tests
// that run a host without one: every key of brood_agents and brood_runs,
// with no scope check (the coordinator's is pinned by its own test). It
// stops with the test.
func ServeLeaderReads(t testing.TB, st *store.Store) {
	t.Helper()
	sub, err := st.NC.Subscribe(st.Subj.KVLatestAll(), func(m *nats.Msg) {
		_, bucket, _ := st.Subj.KVLatestOf(m.Subject)
		if bucket != st.Subj.BucketAgents() && bucket != st.Subj.BucketRuns() {
			return
		}
		var req protocol.KVLatestRequest
		if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &req); err != nil {
			return
		}
		data, rev, found, err := st.LeaderGet(context.Background(), bucket, req.Key)
		if err != nil {
			return // no answer: the host asks again
		}
		out, err := protocol.Marshal(protocol.Msgpack, protocol.KVLatestReply{Found: found, Revision: rev, Value: data})
		if err == nil {
			_ = m.Respond(out)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}
