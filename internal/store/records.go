package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Record is one decoded KV value with the revision a CAS must name.
type Record[T any] struct {
	Value    T
	Revision uint64
}

// Get reads key from kv. A missing or deleted key is ErrNotFound.
func Get[T any](ctx context.Context, kv jetstream.KeyValue, key string) (Record[T], error) {
	var r Record[T]
	e, err := kv.Get(ctx, key)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return r, ErrNotFound
		}
		return r, err
	}
	if err := protocol.Unmarshal(protocol.Msgpack, e.Value(), &r.Value); err != nil {
		return r, fmt.Errorf("decode %s/%s: %w", kv.Bucket(), key, err)
	}
	r.Revision = e.Revision()
	return r, nil
}

// Create writes key only if it does not exist (or was deleted). An existing
// key is ErrConflict.
func Create[T any](ctx context.Context, kv jetstream.KeyValue, key string, v T) (uint64, error) {
	data, err := protocol.Marshal(protocol.Msgpack, v)
	if err != nil {
		return 0, err
	}
	rev, err := kv.Create(ctx, key, data)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) || isWrongLastSeq(err) {
			return 0, fmt.Errorf("%w: %s/%s exists", ErrConflict, kv.Bucket(), key)
		}
		return 0, err
	}
	return rev, nil
}

// Update writes key only if its revision is still rev (compare-and-set). A
// lost race is ErrConflict.
func Update[T any](ctx context.Context, kv jetstream.KeyValue, key string, v T, rev uint64) (uint64, error) {
	data, err := protocol.Marshal(protocol.Msgpack, v)
	if err != nil {
		return 0, err
	}
	nrev, err := kv.Update(ctx, key, data, rev)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || isWrongLastSeq(err) {
			return 0, fmt.Errorf("%w: %s/%s changed since revision %d", ErrConflict, kv.Bucket(), key, rev)
		}
		return 0, err
	}
	return nrev, nil
}

// Put writes key unconditionally (host heartbeats only).
func Put[T any](ctx context.Context, kv jetstream.KeyValue, key string, v T) (uint64, error) {
	data, err := protocol.Marshal(protocol.Msgpack, v)
	if err != nil {
		return 0, err
	}
	return kv.Put(ctx, key, data)
}

// Delete removes key if its revision is still rev; rev 0 deletes unconditionally.
func Delete(ctx context.Context, kv jetstream.KeyValue, key string, rev uint64) error {
	var opts []jetstream.KVDeleteOpt
	if rev > 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	err := kv.Delete(ctx, key, opts...)
	if err != nil && (errors.Is(err, jetstream.ErrKeyRevisionMismatch) || isWrongLastSeq(err)) {
		return fmt.Errorf("%w: %s/%s changed since revision %d", ErrConflict, kv.Bucket(), key, rev)
	}
	return err
}

// Decode decodes one KV entry's value (for watchers).
func Decode[T any](e jetstream.KeyValueEntry) (T, error) {
	var v T
	err := protocol.Unmarshal(protocol.Msgpack, e.Value(), &v)
	return v, err
}
