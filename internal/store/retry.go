package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Transient JetStream failures (shared/RELIABILITY.md: never treat a leader
// election as final). While a stream's or bucket's leader is being elected,
// or a client reconnects to another node, a request can find no responder,
// get "no response from stream", be answered "temporarily unavailable", or
// get no answer at all (the node that had it died). Every write of the store
// is retried on these within its caller's deadline, and made idempotent:
//
//   - stream appends carry a Nats-Msg-Id and, when conditional, are checked
//     against the subject's last message after a refusal (a retry of an
//     append that landed comes back as a conflict, docs/design.md §12);
//   - KV creates and updates that come back as a conflict after an attempt
//     with an unknown outcome read the key: our own value there means the
//     earlier attempt landed;
//   - a conditional KV delete that comes back as a conflict after an unknown
//     attempt succeeded when the key is gone.
//
// The caller's context deadline is the operation's budget; an operation whose
// context has no deadline gets WriteBudget. Running out of it returns the last
// error: that is what DURABILITY_FAILED and UNAVAILABLE mean to callers.

// AttemptTimeout bounds one attempt of a JetStream request: a request sent to
// a node that then died is never answered, and must not use the whole budget.
const AttemptTimeout = 2 * time.Second

// WriteBudget is the budget of a store operation whose context has no deadline.
const WriteBudget = 10 * time.Second

// Backoff between attempts: doubling from retryWaitMin up to retryWaitMax.
const (
	retryWaitMin = 25 * time.Millisecond
	retryWaitMax = 500 * time.Millisecond
)

// errBusy is a conditional write refused while the key or subject was
// unchanged: another write to it was in flight (JetStream answers 10164),
// so it is tried again.
var errBusy = errors.New("another write to the same key or subject is in flight")

// errPlacementNotReady wraps a stream creation's "no suitable peers for
// placement" (provision.go, placementNotReady), retried while provisioning.
var errPlacementNotReady = errors.New("placement not ready")

// ErrIncompleteRead is a whole-log read whose batches stopped before the
// subject's last record: a replica that is not yet current (after a restart
// or an election) answered the direct get. Reading again is the remedy.
var ErrIncompleteRead = errors.New("incomplete read")

// Transient reports whether err is a JetStream or connection failure that a
// retry of the same request can outlive (elections, reconnects, a lost
// answer, a lagging replica), as opposed to a refusal.
func Transient(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, ErrIncompleteRead) || errors.Is(err, errBusy) || errors.Is(err, errPlacementNotReady) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case 10004, // JSClusterIncompleteErr: incomplete results
			10007, // JSClusterNotAssignedErr
			10008, // JSClusterNotAvailErr: JetStream system temporarily unavailable
			10009, // JSClusterNotLeaderErr: cluster can not handle request
			10118, // JSStreamOfflineErr
			10158, // duplicate message id is in process (a retry racing the original)
			10163: // expected last sequence per subject temporarily unavailable
			return true
		}
	}
	return false
}

// withBudget returns ctx bounded by WriteBudget when it has no deadline.
func withBudget(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, WriteBudget)
}

// retry calls op until it returns nil or an error that is not Transient, or
// ctx's budget ran out. Each attempt gets at most AttemptTimeout; unknown
// tells op whether an earlier attempt may have landed (its answer was lost),
// so op can recognise its own write.
func retry(ctx context.Context, op func(ctx context.Context, unknown bool) error) error {
	return retryEach(ctx, AttemptTimeout, op)
}

// retryEach is retry with attempts of at most attempt each (long reads),
// but never more than a third of the budget left (and at least
// AttemptTimeout), so a request lost with a node leaves time to ask again.
func retryEach(ctx context.Context, attempt time.Duration, op func(ctx context.Context, unknown bool) error) error {
	ctx, cancel := withBudget(ctx)
	defer cancel()
	wait := retryWaitMin
	unknown := false
	for {
		each := attempt
		if d, ok := ctx.Deadline(); ok && attempt > AttemptTimeout {
			each = min(attempt, max(AttemptTimeout, time.Until(d)/3))
		}
		actx, acancel := context.WithTimeout(ctx, each)
		err := op(actx, unknown)
		acancel()
		if err == nil || !Transient(err) || ctx.Err() != nil {
			if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
				return ctx.Err()
			}
			return err
		}
		// A request that got no answer (or a 503 after it was sent) may have
		// been carried out.
		unknown = true
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, retryWaitMax)
	}
}

// Retry runs op under the store's retry rules (see Transient) within ctx's
// deadline, or WriteBudget. op must be idempotent.
func Retry(ctx context.Context, op func(ctx context.Context) error) error {
	return retry(ctx, func(ctx context.Context, _ bool) error { return op(ctx) })
}

// Reads that decide whether a write of ours landed go to the stream's
// leader. Brood's streams and buckets allow direct gets, which any replica
// answers once it is nearly caught up, so right after an election a
// follower can answer without the write that was just acknowledged; deciding
// "not ours" from such an answer would report a landed write as fenced or
// conflicting. The stream's message-get API is answered by its leader only.

// leaderMsg is the message part of a $JS.API.STREAM.MSG.GET answer.
type leaderMsg struct {
	Message *struct {
		Subject string    `json:"subject"`
		Seq     uint64    `json:"seq"`
		Time    time.Time `json:"time"`
		Header  []byte    `json:"hdrs,omitempty"`
		Data    []byte    `json:"data,omitempty"`
	} `json:"message,omitempty"`
	Error *jetstream.APIError `json:"error,omitempty"`
}

// leaderLast reads the last message of subject in stream from the stream's
// leader. No message is jetstream.ErrMsgNotFound.
func (s *Store) leaderLast(ctx context.Context, stream, subject string) (*jetstream.RawStreamMsg, error) {
	return s.leaderGetMsg(ctx, stream, map[string]any{"last_by_subj": subject})
}

// directLast reads the last message of subject (a subject or a pattern:
// the last of any subject it matches) in stream by a direct get with the
// subject in the API subject and an empty body, which any current replica
// answers (nats-server: a permission on the API subject scopes it by
// subject; docs/security.md). No message is jetstream.ErrMsgNotFound.
func (s *Store) directLast(ctx context.Context, stream, subject string) (*jetstream.RawStreamMsg, error) {
	resp, err := s.NC.RequestWithContext(ctx, s.api+"DIRECT.GET."+stream+"."+subject, nil)
	if err != nil {
		return nil, err
	}
	switch status := resp.Header.Get("Status"); status {
	case "":
	case "404":
		return nil, jetstream.ErrMsgNotFound
	default:
		return nil, fmt.Errorf("direct get of %s in %s: %s %s", subject, stream, status, resp.Header.Get("Description"))
	}
	seq, err := strconv.ParseUint(resp.Header.Get("Nats-Sequence"), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("direct get of %s in %s: no valid Nats-Sequence: %w", subject, stream, err)
	}
	return &jetstream.RawStreamMsg{Subject: resp.Header.Get("Nats-Subject"), Sequence: seq, Header: resp.Header, Data: resp.Data}, nil
}

// leaderSeq reads the message of stream at sequence seq from the stream's
// leader. No message there (never stored, or deleted) is
// jetstream.ErrMsgNotFound.
func (s *Store) leaderSeq(ctx context.Context, stream string, seq uint64) (*jetstream.RawStreamMsg, error) {
	return s.leaderGetMsg(ctx, stream, map[string]any{"seq": seq})
}

// leaderGetMsg sends a $JS.API.STREAM.MSG.GET request (body) to stream's
// leader and returns the message it answers.
func (s *Store) leaderGetMsg(ctx context.Context, stream string, body map[string]any) (*jetstream.RawStreamMsg, error) {
	req, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	resp, err := s.NC.RequestWithContext(ctx, s.api+"STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, err
	}
	var r leaderMsg
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, fmt.Errorf("decode the stream's answer: %w", err)
	}
	switch {
	case r.Error != nil && r.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrMsgNotFound
	case r.Error != nil:
		return nil, r.Error
	case r.Message == nil:
		return nil, jetstream.ErrInvalidJetStreamResponse
	}
	m := &jetstream.RawStreamMsg{Subject: r.Message.Subject, Sequence: r.Message.Seq, Time: r.Message.Time, Data: r.Message.Data, Header: nats.Header{}}
	if len(r.Message.Header) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(r.Message.Header); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// bucket is a KV bucket of the store: its reads that decide whether a write
// landed go to the bucket stream's leader (leaderGet).
type bucket struct {
	jetstream.KeyValue
	s *Store
}

// leaderGet reads key from the bucket stream's leader: its value and
// revision, or found false when the key has no value (never written,
// deleted or purged).
func (b *bucket) leaderGet(ctx context.Context, key string) (data []byte, rev uint64, found bool, err error) {
	m, err := b.s.leaderLast(ctx, "KV_"+b.Bucket(), "$KV."+b.Bucket()+"."+key)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, 0, false, nil
	}
	if err != nil {
		return nil, 0, false, err
	}
	if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return nil, m.Sequence, false, nil
	}
	return m.Data, m.Sequence, true, nil
}

// updateTTL is a compare-and-set of key at revision rev (as
// jetstream.KeyValue.Update) whose value carries a per-message TTL (Nats-TTL,
// at least 1 s; the bucket allows them, provision.go): the server removes
// the key ttl after this write, unless a later write replaces it first.
// nats.go's KeyValue.Update takes no TTL; this is the same publish (the
// key's subject, Nats-Expected-Last-Subject-Sequence rev) with the TTL.
func (b *bucket) updateTTL(ctx context.Context, key string, value []byte, rev uint64, ttl time.Duration) (uint64, error) {
	return b.publishAt(ctx, key, value, rev, jetstream.WithMsgTTL(ttl))
}

// Update is jetstream.KeyValue.Update (nats.go v1.4x, kvs.Update): the same
// publish to the key's subject with Nats-Expected-Last-Subject-Sequence
// revision, a refusal for a wrong last sequence wrapped as
// jetstream.ErrKeyRevisionMismatch, an invalid key refused as
// jetstream.ErrInvalidKey; but the key is checked by validKey, a byte loop,
// where nats.go matches a regular expression on every write (28 µs of the
// coordinator's and the worker's CPU per one-shot run together, issue 12's
// profile).
func (b *bucket) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	if !validKey(key) {
		return 0, jetstream.ErrInvalidKey
	}
	rev, err := b.publishAt(ctx, key, value, revision)
	if err != nil && isWrongLastSeq(err) {
		err = fmt.Errorf("%w: %w", err, jetstream.ErrKeyRevisionMismatch)
	}
	return rev, err
}

// Create is jetstream.KeyValue.Create: a key with no value yet is written
// by the publish of Update at revision 0 (checked by validKey); a key that
// has one, or had one and was deleted, is left to nats.go's Create, which
// writes over a delete marker and refuses an existing key with
// jetstream.ErrKeyExists. With options (a TTL) it is nats.go's throughout.
func (b *bucket) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if len(opts) > 0 || !validKey(key) {
		return b.KeyValue.Create(ctx, key, value, opts...)
	}
	rev, err := b.publishAt(ctx, key, value, 0)
	if err != nil && isWrongLastSeq(err) {
		return b.KeyValue.Create(ctx, key, value)
	}
	return rev, err
}

// publishAt publishes value to key's subject if the key's last revision is
// revision (0: it has none), with opts (a TTL: updateTTL).
func (b *bucket) publishAt(ctx context.Context, key string, value []byte, revision uint64, opts ...jetstream.PublishOpt) (uint64, error) {
	m := &nats.Msg{Subject: b.s.kvWriteSubject(b.Bucket(), key), Header: nats.Header{}, Data: value}
	ack, err := b.s.JS.PublishMsg(ctx, m, append(opts, jetstream.WithExpectLastSequencePerSubject(revision))...)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// validKey is nats.go's key check (jetstream keyValid: not empty, no
// leading, trailing or double dot, only -/_=. and ASCII letters and digits)
// without its regular expression.
func validKey(key string) bool {
	if key == "" || key[0] == '.' || key[len(key)-1] == '.' {
		return false
	}
	for i := 0; i < len(key); i++ {
		switch c := key[i]; {
		case c == '.' && key[i-1] == '.':
			return false
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9',
			c == '-', c == '/', c == '_', c == '=', c == '.':
		default:
			return false
		}
	}
	return true
}

// ttlUpdater is a bucket that can write a key by compare-and-set with a
// per-message TTL (bucket.updateTTL; faultKV passes it through its hooks).
// A write with a TTL goes to the outermost layer of a bucket that has it
// (layerAs): wrappers need not pass it through.
type ttlUpdater interface {
	updateTTL(ctx context.Context, key string, value []byte, rev uint64, ttl time.Duration) (uint64, error)
}

// leaderGetter is a bucket that reads keys from its stream's leader. A
// leader read goes to the outermost layer of a bucket that has it (layerAs).
type leaderGetter interface {
	leaderGet(ctx context.Context, key string) (data []byte, rev uint64, found bool, err error)
}

// kvWrapper is a wrapper of a store's bucket (faultKV, leaderVia): unwrap
// returns the bucket it wraps, as errors.Unwrap returns a wrapped error.
// The store's own methods of a bucket (ttlUpdater, leaderGetter) are found
// through the wrappers (layerAs), so a wrapper passes them through by having
// unwrap, and intercepts one only by having the method itself (faultKV's
// updateTTL and leaderGet). A wrapper without unwrap hides them: a TTL'd
// write through it fails (UpdateTTL), a leader read falls back to Get.
type kvWrapper interface {
	unwrap() jetstream.KeyValue
}

// layerAs returns the outermost layer of kv that is a T: kv itself, else the
// bucket it wraps (kvWrapper), and so on inwards, as errors.As walks an
// error's chain; ok is false when no layer is a T.
func layerAs[T any](kv jetstream.KeyValue) (t T, ok bool) {
	for kv != nil {
		if t, ok = kv.(T); ok {
			return t, true
		}
		w, wraps := kv.(kvWrapper)
		if !wraps {
			break
		}
		kv = w.unwrap()
	}
	return t, false
}

// latest reads key's value and revision for a landed-write check: from the
// leader when kv is a bucket of a Store or a wrapper of one (layerAs), else
// kv.Get. A deleted key reads as not found at the revision of its delete
// marker; a key with no message at all, as revision 0.
func latest(ctx context.Context, kv jetstream.KeyValue, key string) (data []byte, rev uint64, found bool, err error) {
	if b, ok := layerAs[leaderGetter](kv); ok {
		return b.leaderGet(ctx, key)
	}
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		// kv.Get does not tell a deleted key from one never written: taken
		// as deleted at a revision later than any a caller holds.
		return nil, math.MaxUint64, false, nil
	}
	if err != nil {
		return nil, 0, false, err
	}
	return e.Value(), e.Revision(), true, nil
}
