package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/brood-dev/brood/pkg/protocol"
)

// HostRecordsMax bounds the host records one listing reads (live hosts and
// those that stopped within the bucket's TTL).
const HostRecordsMax = 4096

// HostRecords reads every record of brood_hosts with one batch direct get
// of each key's last value, without a consumer: a worker may not create
// consumers (a consumer's deliver subject is not checked against its
// creator's permissions; docs/security.md), and it checks the other hosts'
// descriptors before it registers. Deleted keys are left out. A listing cut
// short (its deadline, more than HostRecordsMax keys) is an error, never a
// shorter list. A transient failure (Transient: no responders while the
// bucket's stream has no leader yet, as on a cluster just provisioned, or
// through an election) is retried within ctx's deadline, else WriteBudget.
func (s *Store) HostRecords(ctx context.Context) ([]protocol.HostRecord, error) {
	var out []protocol.HostRecord
	err := retry(ctx, func(ctx context.Context, _ bool) error {
		var err error
		out, err = s.hostRecords(ctx)
		return err
	})
	return out, err
}

// hostRecords is one attempt of HostRecords.
func (s *Store) hostRecords(ctx context.Context) ([]protocol.HostRecord, error) {
	stream := kvStreamPrefix + s.Subj.BucketHosts()
	prefix := "$KV." + s.Subj.BucketHosts() + "."
	msgs, err := jetstreamext.GetLastMsgsFor(ctx, s.JS, stream, []string{prefix + ">"},
		jetstreamext.GetLastMsgsBatchSize(HostRecordsMax))
	if err != nil {
		return nil, fmt.Errorf("list hosts: %w", err)
	}
	var out []protocol.HostRecord
	complete := false
	for m, err := range msgs {
		if errors.Is(err, jetstreamext.ErrNoMessages) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list hosts: %w", err)
		}
		complete = m.Header.Get(headerNumPending) == "0"
		if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" || len(m.Data) == 0 {
			continue
		}
		var rec protocol.HostRecord
		if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &rec); err != nil {
			continue // not a host record: nothing to compare with
		}
		if m.Subject != prefix+HostKey(rec.HostID) {
			continue // a record under another host's key: not that host's
		}
		out = append(out, rec)
	}
	if !complete {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("list hosts: %w", err)
		}
		return nil, fmt.Errorf("list hosts: the listing ended before its last key (more than %d keys, or no answer in time)", HostRecordsMax)
	}
	return out, nil
}
