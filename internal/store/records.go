package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Record is one decoded KV value with the revision a CAS must name.
type Record[T any] struct {
	Value    T
	Revision uint64
}

// Get reads key from kv, retrying transient failures (retry.go). A missing
// or deleted key is ErrNotFound.
func Get[T any](ctx context.Context, kv jetstream.KeyValue, key string) (Record[T], error) {
	var r Record[T]
	var e jetstream.KeyValueEntry
	err := Retry(ctx, func(ctx context.Context) (err error) {
		e, err = kv.Get(ctx, key)
		return err
	})
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return r, ErrNotFound
		}
		return r, err
	}
	if err := protocol.Unmarshal(protocol.Msgpack, e.Value(), &r.Value); err != nil {
		return r, fmt.Errorf("decode %s/%s: %w", kv.Bucket(), key, err)
	}
	if !whole(&r.Value) {
		return Record[T]{}, ErrNotFound
	}
	r.Revision = e.Revision()
	return r, nil
}

// GetLatest is Get answered by the bucket stream's leader, never by a replica
// that may not have the latest write yet (for decisions that rest on it).
func GetLatest[T any](ctx context.Context, kv jetstream.KeyValue, key string) (Record[T], error) {
	var r Record[T]
	var st kvState
	err := Retry(ctx, func(ctx context.Context) (err error) {
		st, err = readLeader(ctx, kv, key)
		return err
	})
	if err != nil {
		return r, err
	}
	if !st.found {
		return r, ErrNotFound
	}
	if err := protocol.Unmarshal(protocol.Msgpack, st.data, &r.Value); err != nil {
		return r, fmt.Errorf("decode %s/%s: %w", kv.Bucket(), key, err)
	}
	if !whole(&r.Value) {
		return Record[T]{}, ErrNotFound
	}
	r.Revision = st.rev
	return r, nil
}

// getMatching reads the last value of whichever key of kv matches pattern
// (a key with a * token, matching at most one key by the caller's layout:
// RunSpecPattern) and returns that key: by a direct get with the pattern
// in the API subject ($JS.API.DIRECT.GET.<stream>.<subject>, empty body,
// which any replica answers and a NATS permission can scope by subject),
// or from the bucket stream's leader when leader is set (a decision on a
// key's absence; after Faults.LeaderRead). No match, or a deleted key, is
// ErrNotFound. Transient failures are retried (retry.go).
func getMatching[T any](ctx context.Context, s *Store, kv jetstream.KeyValue, pattern string, leader bool) (string, Record[T], error) {
	var r Record[T]
	prefix := "$KV." + kv.Bucket() + "."
	stream := kvStreamPrefix + kv.Bucket()
	var m *jetstream.RawStreamMsg
	err := Retry(ctx, func(ctx context.Context) (err error) {
		if !leader {
			m, err = s.directLast(ctx, stream, prefix+pattern)
			return err
		}
		if s.leaderRead != nil {
			if err := s.leaderRead(ctx, kv.Bucket(), pattern); err != nil {
				return err
			}
		}
		m, err = s.leaderLast(ctx, stream, prefix+pattern)
		return err
	})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return "", r, ErrNotFound
	}
	if err != nil {
		return "", r, err
	}
	if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return "", r, ErrNotFound
	}
	key := strings.TrimPrefix(m.Subject, prefix)
	if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &r.Value); err != nil {
		return "", r, fmt.Errorf("decode %s/%s: %w", kv.Bucket(), key, err)
	}
	if !whole(&r.Value) {
		return "", Record[T]{}, ErrNotFound
	}
	r.Revision = m.Sequence
	return key, r, nil
}

// isKVConflict reports a KV compare-and-set refusal (10071 or, on replicated
// buckets, 10164: docs/design.md §12).
func isKVConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) || isWrongLastSeq(err)
}

// A refused compare-and-set is not always a lost race. A replicated stream
// also answers 10164 while another write to the same subject is in flight
// (which may be our own earlier attempt, whose answer was lost, or a write
// that is then lost with its leader), and a retry of a write that landed is
// refused too (docs/design.md §12). So every refusal is decided by reading the key
// from the leader: our value there means our write landed; the key as we
// expected it (unchanged), or not even at the revision we expect (a leader
// that has not applied every write: one just elected, or a deposed one
// still answering as a partition heals), means nothing is known to have
// changed, and the write is tried again (errBusy, transient); anything else
// is the conflict.

// kvState is a key as the leader has it.
type kvState struct {
	data  []byte
	rev   uint64
	found bool
}

func readLeader(ctx context.Context, kv jetstream.KeyValue, key string) (kvState, error) {
	v, rev, found, err := latest(ctx, kv, key)
	return kvState{v, rev, found}, err
}

// decideRefusal decides a refused write of data to key, expected at revision
// rev (0: a create, the key absent or deleted), by reading the key from the
// leader: our value there, at a later revision than expected, means an
// earlier attempt whose answer was lost landed (its revision is returned);
// the key as expected (a create's key still absent; an update's key still at
// rev, or not even there: a leader that has not applied every write, one
// just elected or a deposed one still answering as a partition heals) is
// errBusy, tried again; a read that failed is its error, tried again;
// anything else is ErrConflict.
func decideRefusal(ctx context.Context, kv jetstream.KeyValue, key string, data []byte, rev uint64) (uint64, error) {
	st, err := readLeader(ctx, kv, key)
	switch {
	case err != nil:
		return 0, err // ask again
	case st.found && st.rev > rev && bytes.Equal(st.data, data):
		return st.rev, nil
	case rev == 0 && !st.found, rev > 0 && (st.found && st.rev == rev || st.rev < rev):
		return 0, errBusy
	case rev == 0:
		return 0, fmt.Errorf("%w: %s/%s exists", ErrConflict, kv.Bucket(), key)
	}
	return 0, fmt.Errorf("%w: %s/%s changed since revision %d", ErrConflict, kv.Bucket(), key, rev)
}

// Create writes key only if it does not exist (or was deleted), retrying
// transient failures. An existing key is ErrConflict, unless it holds this
// very value (an earlier attempt whose answer was lost landed). opts may
// give the key its own lifetime (jetstream.KeyTTL, at least 1 s: the server
// removes the key when it expires; every bucket allows per-key TTLs,
// provision.go).
func Create[T any](ctx context.Context, kv jetstream.KeyValue, key string, v T, opts ...jetstream.KVCreateOpt) (uint64, error) {
	data, err := protocol.Marshal(protocol.Msgpack, v)
	if err != nil {
		return 0, err
	}
	var rev uint64
	err = retry(ctx, func(ctx context.Context, unknown bool) (err error) {
		rev, err = kv.Create(ctx, key, data, opts...)
		if err == nil || !isKVConflict(err) {
			return err
		}
		rev, err = decideRefusal(ctx, kv, key, data, 0)
		return err
	})
	return rev, err
}

// Update writes key only if its revision is still rev (compare-and-set),
// retrying transient failures. A lost race is ErrConflict, unless the key
// holds this very value at a later revision (an earlier attempt whose answer
// was lost landed).
func Update[T any](ctx context.Context, kv jetstream.KeyValue, key string, v T, rev uint64) (uint64, error) {
	return update(ctx, kv, key, v, rev, 0)
}

// UpdateTTL is Update whose write gives key a per-message TTL of ttl (at
// least 1 s): the server removes the key ttl after the write that landed,
// unless a later write replaces it first. kv must be a bucket of a Store,
// or a wrapper of one (kvWrapper: WithFaults, WithLeaderReads): the write
// publishes with the TTL (nats.go's KeyValue.Update takes none) through the
// bucket under every wrapper, passing the store's Faults, if any, as an
// OpKVUpdate with Write.TTL set.
func UpdateTTL[T any](ctx context.Context, kv jetstream.KeyValue, key string, v T, rev uint64, ttl time.Duration) (uint64, error) {
	if ttl < time.Second {
		return 0, fmt.Errorf("store: update %s/%s with a TTL of %s: a key's TTL is at least 1s", kv.Bucket(), key, ttl)
	}
	return update(ctx, kv, key, v, rev, ttl)
}

// update is Update, with a per-message TTL when ttl is above 0.
func update[T any](ctx context.Context, kv jetstream.KeyValue, key string, v T, rev uint64, ttl time.Duration) (uint64, error) {
	data, err := protocol.Marshal(protocol.Msgpack, v)
	if err != nil {
		return 0, err
	}
	return updateRaw(ctx, kv, key, data, rev, ttl)
}

// updateRaw is update of a value already encoded.
func updateRaw(ctx context.Context, kv jetstream.KeyValue, key string, data []byte, rev uint64, ttl time.Duration) (uint64, error) {
	var withTTL ttlUpdater // the layer that writes with a TTL
	if ttl > 0 {
		u, ok := layerAs[ttlUpdater](kv)
		if !ok {
			return 0, fmt.Errorf("store: update %s/%s with a TTL: the bucket is not a store's, nor a wrapper of one", kv.Bucket(), key)
		}
		withTTL = u
	}
	var nrev uint64
	err := retry(ctx, func(ctx context.Context, unknown bool) (err error) {
		if ttl > 0 {
			nrev, err = withTTL.updateTTL(ctx, key, data, rev, ttl)
		} else {
			nrev, err = kv.Update(ctx, key, data, rev)
		}
		if err == nil || !isKVConflict(err) {
			return err
		}
		nrev, err = decideRefusal(ctx, kv, key, data, rev)
		return err
	})
	return nrev, err
}

// Put writes key unconditionally (host heartbeats, markers), retrying
// transient failures.
func Put[T any](ctx context.Context, kv jetstream.KeyValue, key string, v T) (uint64, error) {
	data, err := protocol.Marshal(protocol.Msgpack, v)
	if err != nil {
		return 0, err
	}
	var rev uint64
	err = Retry(ctx, func(ctx context.Context) (err error) {
		rev, err = kv.Put(ctx, key, data)
		return err
	})
	return rev, err
}

// Delete removes key if its revision is still rev; rev 0 deletes
// unconditionally. Transient failures are retried; a refused conditional
// delete succeeded when the key is gone after an attempt whose answer was
// lost, is tried again while the key is unchanged, and is ErrConflict
// otherwise.
func Delete(ctx context.Context, kv jetstream.KeyValue, key string, rev uint64) error {
	var opts []jetstream.KVDeleteOpt
	if rev > 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	return retry(ctx, func(ctx context.Context, unknown bool) error {
		err := kv.Delete(ctx, key, opts...)
		if err == nil || !isKVConflict(err) {
			return err
		}
		st, gerr := readLeader(ctx, kv, key)
		switch {
		case gerr != nil:
			return gerr // ask again
		case st.found && st.rev == rev, st.rev < rev:
			return errBusy // unchanged, or a leader not yet at rev (see Update)
		case !st.found && unknown:
			return nil
		}
		return fmt.Errorf("%w: %s/%s changed since revision %d", ErrConflict, kv.Bucket(), key, rev)
	})
}

// Decode decodes one KV entry's value (for watchers).
func Decode[T any](e jetstream.KeyValueEntry) (T, error) {
	var v T
	if err := protocol.Unmarshal(protocol.Msgpack, e.Value(), &v); err != nil {
		return v, err
	}
	if w, ok := any(v).(protocol.WrittenRecord); ok {
		if err := w.Written(); err != nil {
			var zero T
			return zero, fmt.Errorf("decode %s: %w", e.Key(), err)
		}
	}
	return v, nil
}

// whole reports whether v, just decoded, is a record its writer could have
// written (protocol.WrittenRecord): one that is not is no record, and the
// reads above answer ErrNotFound for it (docs/security.md, "Replies go only
// where replies may go").
func whole[T any](v *T) bool {
	w, ok := any(*v).(protocol.WrittenRecord)
	return !ok || w.Written() == nil
}
