package deploy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// The confused deputy (issue 29, item 1; docs/security.md, "Replies go
// only where replies may go"): a service publishes its answer with its own
// NATS permissions, on the reply subject the request names. The
// coordinator may write every bucket and stream of Brood, so a client that
// named $KV.brood_agents.grant.<sha256hex(T)> as the reply subject of an
// agents.open had the coordinator write a grant record (its AgentsOpenReply,
// whose expiresAt passed for a grant's over every session): T then acted
// on every session. Each attempt below names a reply subject outside the
// caller's own inbox; the coordinator must refuse it unanswered (its
// handler never runs: no root opened, nothing written) and count it in
// brood_replies_refused_total.

// refusedReplies is what the deployment's coordinator counted in
// brood_replies_refused_total so far.
func (f *forgery) refusedReplies() float64 {
	fams, err := f.coordMetrics.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	n, _ := fams.Sum("brood_replies_refused_total", "service", "coordinator")
	return n
}

// deputyRequest sends data on subject with reply subject reply and returns
// the refusal: the permissions violation when NATS refused the publish, or
// the coordinator's count of a refused reply subject; nil when neither
// came (the coordinator answered, or did nothing, within the wait).
func (f *forgery) deputyRequest(nc *nats.Conn, subject, reply string, enc protocol.Encoding, body any) error {
	data, err := protocol.Marshal(enc, body)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: subject, Reply: reply, Data: data, Header: nats.Header{}}
	m.Header.Set(protocol.HeaderContentType, enc.ContentType())
	before := f.refusedReplies()
	if err := refusedPublish(nc, m); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if after := f.refusedReplies(); after > before {
			return fmt.Errorf("refused unanswered: brood_replies_refused_total %v -> %v", before, after)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// grantKeyOf is the brood_agents key a grant T is looked up under.
func grantKeyOf(grant string) string {
	sum := sha256.Sum256([]byte(grant))
	return store.GrantKey(hex.EncodeToString(sum[:]))
}

// noGrant fails unless grant is unknown to the bucket and refused by the
// coordinator as a grant (UNAUTHORIZED), for nc's user.
func (f *forgery) noGrant(ctx context.Context, t *testing.T, nc *nats.Conn, grant string) {
	t.Helper()
	kv, err := f.js.KeyValue(ctx, "brood_agents")
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(ctx, grantKeyOf(grant)); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("a record under the grant key: %v, %v", e, err)
	}
	cl, err := client.New(nc, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Log(ctx, protocol.LogReadRequest{SessionID: f.victim.hostChild, Authority: protocol.Authority{Grant: grant}}); protocol.CodeOf(err) != protocol.CodeUnauthorized {
		t.Fatalf("the forged grant read another user's log: %v", err)
	}
}

// quiet waits until the stored state stops changing (the coordinators'
// writes after the set-up's runs settled, such as their specs' expiry), so
// that an attempt run first (go test -run) is judged on its own writes.
func (f *forgery) quiet(t *testing.T) {
	t.Helper()
	prev := f.snapshot()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		cur := f.snapshot()
		same := true
		for name, b := range prev {
			same = same && slices.Equal(cur[name], b)
		}
		if same {
			return
		}
		prev = cur
	}
	t.Fatal("the stored state kept changing for 30 s with no attempt running")
}

func (f *forgery) deputyAttempts(t *testing.T) {
	v := &f.victim
	f.quiet(t)
	const forgedGrant = "T-forged-grant-of-the-deputy"
	open := protocol.AgentsOpenRequest{Cwd: "/tmp"}
	f.run(t, "client", []attempt{
		{"agents.open answered into a grant key (MessagePack)", func(ctx context.Context, t *testing.T, nc *nats.Conn) error {
			err := f.deputyRequest(nc, "brood.v1.user.client.agents.open", "$KV.brood_agents."+grantKeyOf(forgedGrant), protocol.Msgpack, open)
			f.noGrant(ctx, t, nc, forgedGrant)
			return err
		}},
		{"agents.open answered into a stream purge (JSON: the reply would be its body)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return f.deputyRequest(nc, "brood.v1.user.client.agents.open", "$JS.API.STREAM.PURGE.BROOD_LOG_spawn", protocol.JSON, open)
		}},
		{"agents.open answered into a session header subject", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return f.deputyRequest(nc, "brood.v1.user.client.agents.open", "brood.v1.session.FORGED", protocol.Msgpack, open)
		}},
		{"authority.user answered into the trusted host's inbox", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return f.deputyRequest(nc, "brood.v1.user.client.authority.user", "_INBOX.trusted-host.forged", protocol.Msgpack, protocol.Empty{})
		}},
		{"agents.renew answered into a coordinator's own inbox", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return f.deputyRequest(nc, "brood.v1.user.client.agents.renew", v.coordInbox, protocol.Msgpack, v.root.Ref())
		}},
		{"events.follow streamed into a drain marker", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return f.deputyRequest(nc, "brood.v1.user.client.events.follow", "$KV.brood_agents."+store.DrainKey(store.DrainAll), protocol.Msgpack,
				protocol.EventsFollowRequest{Parent: v.root.SessionID, Authority: v.root.Authority()})
		}},
		{"a mistyped endpoint answered into a slot record", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return f.deputyRequest(nc, "brood.v1.user.client.no.such.endpoint", "$KV.brood_agents."+store.SlotsKey(v.root.SessionID), protocol.Msgpack, protocol.Empty{})
		}},
	})
	f.run(t, "worker-spawn", []attempt{
		{"a leader read answered into another provider's run spec", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return f.deputyRequest(nc, "brood.v1.read.spawn.kvlatest.brood_runs", "$KV.brood_runs.spec.fork."+v.forkRun.RunID, protocol.Msgpack,
				protocol.KVLatestRequest{Key: "state.spawn.NOSUCH"})
		}},
		{"an epoch end answered into a root's lease", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return f.deputyRequest(nc, "brood.v1.epochend.spawn."+v.child, "$KV.brood_agents."+store.RootLeaseKey(v.root.SessionID), protocol.Msgpack,
				protocol.EpochEndRequest{RunID: "NOSUCH"})
		}},
	})
	f.run(t, "coordinator", []attempt{
		{"publish into another coordinator's inbox (not an answer: a notice or a follow aimed there)", func(_ context.Context, _ *testing.T, nc *nats.Conn) error {
			return refusedPublish(nc, &nats.Msg{Subject: v.coordInbox + ".forged", Data: []byte("forged")})
		}},
	})
	t.Run("every refusal counted by its reason", func(t *testing.T) {
		fams, err := f.coordMetrics.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, reason := range []string{rpc.ReplyOutsideUserInbox, rpc.ReplyOutsideInboxes} {
			if n, _ := fams.Sum("brood_replies_refused_total", "service", "coordinator", "reason", reason); n == 0 {
				t.Errorf("no refusal counted as %s", reason)
			}
		}
	})
}
