package store

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The fault-injection seam (issue 15). A Store's streams, buckets and
// JetStream context are interfaces; WithFaults returns a copy of the store
// whose writes pass through hooks first, so a test (or a harness) can fail a
// chosen write, hold it, or let it land and then lose its answer, anywhere a
// service writes: a session log append, an inbox item's removal, a lease or
// run record compare-and-set, a heartbeat. Nothing in a product path tests
// for faults: a service given such a store cannot tell it from the real one.

// WriteOp names a kind of store write.
type WriteOp string

// The writes a Faults hook sees.
const (
	// OpKVCreate, OpKVUpdate, OpKVPut and OpKVDelete are KV writes
	// (jetstream.KeyValue Create, Update, Put/PutString, Delete/Purge).
	OpKVCreate WriteOp = "kv.create"
	OpKVUpdate WriteOp = "kv.update"
	OpKVPut    WriteOp = "kv.put"
	OpKVDelete WriteOp = "kv.delete"
	// OpPublish is a JetStream publish (log appends, headers, inbox items,
	// lifecycle events, child index entries), synchronous or not.
	OpPublish WriteOp = "publish"
	// OpMsgDelete deletes one stream message (an inbox item's removal).
	OpMsgDelete WriteOp = "msg.delete"
)

// Write is one store write as a Faults hook sees it.
type Write struct {
	Op WriteOp
	// Bucket and Key name a KV write's key; Revision is the revision an
	// OpKVUpdate expects; Value is what a create, update or put writes (read
	// only; Decode it with protocol.Unmarshal, Msgpack).
	Bucket, Key string
	Revision    uint64
	Value       []byte
	// TTL is the per-message TTL an OpKVUpdate gives the key (0: none; a
	// settlement's, store.SettleRun, and an expiring run spec's).
	TTL time.Duration
	// Stream and Seq name an OpMsgDelete's message.
	Stream string
	Seq    uint64
	// Subject is an OpPublish's subject; Msg is the message (read only).
	Subject string
	Msg     *nats.Msg
	// Async is true for a publish whose acknowledgement arrives later
	// (PublishMsgAsync): its After hook is never called.
	Async bool
}

// Faults intercepts the writes of a Store made by WithFaults. Either hook
// may be nil; both may be called from many goroutines at once.
type Faults struct {
	// Before runs before the write is sent; an error fails the write unsent
	// (the caller gets that error). A hook may also block (a paused writer).
	Before func(ctx context.Context, w Write) error
	// After runs once JetStream answered the write (err is its answer, nil
	// when it landed); what it returns is what the caller gets. Returning an
	// error for a write that landed is an acknowledgement lost on the way.
	After func(ctx context.Context, w Write, err error) error
	// Lagging, when set, makes the replicas that answer direct batch gets
	// of session logs (BROOD_LOG_<scope>) lag: it is asked of each message such a
	// get returns (stream sequence seq), and true ends that batch before
	// it, as a replica that has not yet stored it answers (a batch get
	// stops early without an error). Reads from the stream's leader are
	// not affected. Reads are otherwise not faulted.
	Lagging func(seq uint64) bool
	// LeaderRead, when set, runs before a key of a bucket (its name) is
	// read from the bucket's leader (the reads a decision on the latest
	// value rests on: LeaseLatest, RunLatest, GetLatest, a refused
	// compare-and-set's check); an error fails the read, and a hook may
	// block (a leader election).
	LeaderRead func(ctx context.Context, bucket, key string) error
}

// WithFaults returns a copy of s whose writes go through f. s is unchanged;
// both share the connection.
func (s *Store) WithFaults(f Faults) *Store {
	c := *s
	c.JS = faultJS{JetStream: s.JS, f: f}
	c.lagging = f.Lagging
	c.leaderRead = f.LeaderRead
	c.faults = &f // the log and inbox streams (LogStream, InboxStream)
	for _, str := range []*jetstream.Stream{&c.Sessions, &c.Events} {
		if *str != nil {
			*str = faultStream{Stream: *str, f: f}
		}
	}
	for _, kv := range []*jetstream.KeyValue{&c.Agents, &c.Hosts, &c.Runs} {
		if *kv != nil {
			*kv = faultKV{KeyValue: *kv, f: f}
		}
	}
	return &c
}

func (f Faults) before(ctx context.Context, w Write) error {
	if f.Before == nil {
		return nil
	}
	return f.Before(ctx, w)
}

func (f Faults) after(ctx context.Context, w Write, err error) error {
	if f.After == nil {
		return err
	}
	return f.After(ctx, w, err)
}

// faultKV is a bucket whose writes and leader reads pass Faults
// (WithFaults): a wrapper of the bucket (kvWrapper).
type faultKV struct {
	jetstream.KeyValue
	f Faults
}

// leaderGet reads through to the bucket, after Faults.LeaderRead.
func (kv faultKV) leaderGet(ctx context.Context, key string) ([]byte, uint64, bool, error) {
	if kv.f.LeaderRead != nil {
		if err := kv.f.LeaderRead(ctx, kv.Bucket(), key); err != nil {
			return nil, 0, false, err
		}
	}
	return latest(ctx, kv.KeyValue, key)
}

func (kv faultKV) write(ctx context.Context, w Write, do func() (uint64, error)) (uint64, error) {
	w.Bucket = kv.Bucket()
	if err := kv.f.before(ctx, w); err != nil {
		return 0, err
	}
	rev, err := do()
	return rev, kv.f.after(ctx, w, err)
}

func (kv faultKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	return kv.write(ctx, Write{Op: OpKVCreate, Key: key, Value: value}, func() (uint64, error) { return kv.KeyValue.Create(ctx, key, value, opts...) })
}

func (kv faultKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	return kv.write(ctx, Write{Op: OpKVUpdate, Key: key, Revision: rev, Value: value}, func() (uint64, error) { return kv.KeyValue.Update(ctx, key, value, rev) })
}

// unwrap returns the bucket under the seam (kvWrapper).
func (kv faultKV) unwrap() jetstream.KeyValue { return kv.KeyValue }

// updateTTL is an OpKVUpdate with Write.TTL set (bucket.updateTTL): the one
// wrapper that intercepts a write with a TTL; it writes through the bucket
// it wraps (layerAs).
func (kv faultKV) updateTTL(ctx context.Context, key string, value []byte, rev uint64, ttl time.Duration) (uint64, error) {
	return kv.write(ctx, Write{Op: OpKVUpdate, Key: key, Revision: rev, Value: value, TTL: ttl}, func() (uint64, error) {
		u, ok := layerAs[ttlUpdater](kv.KeyValue)
		if !ok {
			return 0, fmt.Errorf("store: bucket %s cannot write a key with a TTL", kv.Bucket())
		}
		return u.updateTTL(ctx, key, value, rev, ttl)
	})
}

func (kv faultKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	return kv.write(ctx, Write{Op: OpKVPut, Key: key, Value: value}, func() (uint64, error) { return kv.KeyValue.Put(ctx, key, value) })
}

func (kv faultKV) PutString(ctx context.Context, key string, value string) (uint64, error) {
	return kv.write(ctx, Write{Op: OpKVPut, Key: key, Value: []byte(value)}, func() (uint64, error) { return kv.KeyValue.PutString(ctx, key, value) })
}

func (kv faultKV) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	_, err := kv.write(ctx, Write{Op: OpKVDelete, Key: key}, func() (uint64, error) { return 0, kv.KeyValue.Delete(ctx, key, opts...) })
	return err
}

func (kv faultKV) Purge(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	_, err := kv.write(ctx, Write{Op: OpKVDelete, Key: key}, func() (uint64, error) { return 0, kv.KeyValue.Purge(ctx, key, opts...) })
	return err
}

type faultStream struct {
	jetstream.Stream
	f Faults
}

func (s faultStream) del(ctx context.Context, seq uint64, do func() error) error {
	w := Write{Op: OpMsgDelete, Stream: s.CachedInfo().Config.Name, Seq: seq}
	if err := s.f.before(ctx, w); err != nil {
		return err
	}
	return s.f.after(ctx, w, do())
}

func (s faultStream) DeleteMsg(ctx context.Context, seq uint64) error {
	return s.del(ctx, seq, func() error { return s.Stream.DeleteMsg(ctx, seq) })
}

func (s faultStream) SecureDeleteMsg(ctx context.Context, seq uint64) error {
	return s.del(ctx, seq, func() error { return s.Stream.SecureDeleteMsg(ctx, seq) })
}

type faultJS struct {
	jetstream.JetStream
	f Faults
}

func (js faultJS) Publish(ctx context.Context, subject string, payload []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: payload}, opts...)
}

func (js faultJS) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	w := Write{Op: OpPublish, Subject: msg.Subject, Msg: msg}
	if err := js.f.before(ctx, w); err != nil {
		return nil, err
	}
	ack, err := js.JetStream.PublishMsg(ctx, msg, opts...)
	if err = js.f.after(ctx, w, err); err != nil {
		return nil, err
	}
	return ack, nil
}

func (js faultJS) PublishAsync(subject string, payload []byte, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	return js.PublishMsgAsync(&nats.Msg{Subject: subject, Data: payload}, opts...)
}

func (js faultJS) PublishMsgAsync(msg *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if err := js.f.before(context.Background(), Write{Op: OpPublish, Subject: msg.Subject, Msg: msg, Async: true}); err != nil {
		return nil, err
	}
	return js.JetStream.PublishMsgAsync(msg, opts...)
}
