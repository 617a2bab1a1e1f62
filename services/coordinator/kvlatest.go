package coordinator

import (
	"context"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// kvLatest serves protocol.Subjects.KVLatest,
// <p>.v1.kvlatest.<provider>.<bucket> (queue group CoordinatorQueue): a
// worker host's read of a key of brood_agents or brood_runs from the
// bucket stream's leader (store.WithLeaderReads), which a NATS permission
// cannot scope to its provider's keys (docs/security.md, "What comes
// next", item 3). A coordinator answers it only for a key under the
// prefixes of the provider the subject names (store.ScopeOfKey: lease,
// owns, spec, state), and a deployment lets only that provider's workers
// publish the subject, so a worker reads from the leader only its own
// provider's records, as its direct gets.
func (c *Coordinator) kvLatest(ctx context.Context, req rpc.Request, r protocol.KVLatestRequest) (protocol.KVLatestReply, error) {
	provider, bucket, ok := c.subj.KVLatestOf(req.Subject())
	if !ok || (bucket != c.subj.BucketAgents() && bucket != c.subj.BucketRuns()) || r.Key == "" {
		return protocol.KVLatestReply{}, protocol.Errorf(protocol.CodeInvalidArgument,
			"a leader read names a provider and a bucket (%s or %s) in its subject (%s), and a key", c.subj.BucketAgents(), c.subj.BucketRuns(), c.subj.KVLatest("<provider>", "<bucket>"))
	}
	if scope, ok := store.ScopeOfKey(r.Key); !ok || scope != provider {
		return protocol.KVLatestReply{}, protocol.Errorf(protocol.CodeUnauthorized,
			"key %q of %s is not a record of provider %s's workers", r.Key, bucket, provider)
	}
	data, rev, found, err := c.st.LeaderGet(ctx, bucket, r.Key)
	if err != nil {
		return protocol.KVLatestReply{}, protocol.Errorf(protocol.CodeUnavailable, "read %s/%s from the leader: %w", bucket, r.Key, err)
	}
	return protocol.KVLatestReply{Found: found, Revision: rev, Value: data}, nil
}
