package store

import (
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/pkg/protocol"
)

// JetStream domains (issue 36; deploy/README.md, "Sites"). A worker at a
// site connects to the site's leaf node, whose server may run JetStream of
// its own (its own domain): there the plain API subjects $JS.API.> reach
// the site's JetStream, never the hub's, and nats-server denies them on
// the leaf link. Brood's streams and buckets live in the hub's JetStream,
// which a client behind the leaf reaches with the hub's domain in the API
// prefix, $JS.<domain>.API.>, mapped back to $JS.API.> in the hub's
// account. KV writes go the same way: a put of $KV.<bucket>.<key> is
// published to $JS.<domain>.API.$KV.<bucket>.<key>, which the hub maps to
// $KV.<bucket>.<key> (nats-server's JetStream domain mapping table, the
// one nats.go's KV uses with a domain). What a stream stores, and what a
// direct or leader get names as the stored subject, is the same with or
// without a domain: $KV.<bucket>.<key>, brood.v1.log.<scope>.<id>, ...

// apiPrefixLocal is the API prefix without a domain: the account's own
// JetStream.
const apiPrefixLocal = "$JS.API."

// APIPrefix is the JetStream API prefix of domain (Config.JSDomain):
// "$JS.API." without one, "$JS.<domain>.API." with one.
func APIPrefix(domain string) string {
	if domain == "" {
		return apiPrefixLocal
	}
	return "$JS." + domain + ".API."
}

// CheckDomain refuses a JetStream domain that is not one subject token of
// letters, digits, - and _ (protocol.ValidID): it goes into every API
// subject. Empty is no domain.
func CheckDomain(domain string) error {
	if domain != "" && !protocol.ValidID(domain) {
		return fmt.Errorf("store: JetStream domain %q must match ^[A-Za-z0-9_-]{1,64}$ (it is a token of the API subjects $JS.<domain>.API.>)", domain)
	}
	return nil
}

// newJetStream is the JetStream context of domain (empty: the account's
// own). With a domain it is nats.go's API prefix $JS.<domain>.API., not
// jetstream.NewWithDomain: the batch and last-messages gets of
// orbit.go/jetstreamext (ClosedRoots, HostRecords) read the context's
// APIPrefix, and build a domain's subjects without the API token.
func newJetStream(nc *nats.Conn, domain string) (jetstream.JetStream, error) {
	if err := CheckDomain(domain); err != nil {
		return nil, err
	}
	if domain == "" {
		return jetstream.New(nc)
	}
	return jetstream.NewWithAPIPrefix(nc, APIPrefix(domain))
}

// kvWriteSubject is the subject a write of key in bucket publishes to:
// $KV.<bucket>.<key>, or through a domain $JS.<domain>.API.$KV.<bucket>.<key>.
func (s *Store) kvWriteSubject(bucket, key string) string {
	if s.kvWritePrefix == "" {
		return "$KV." + bucket + "." + key
	}
	return s.kvWritePrefix + "$KV." + bucket + "." + key
}
