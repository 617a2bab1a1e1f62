package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/brood-dev/brood/pkg/protocol"
)

// LogReadBatch is how many log records one direct batch get asks for.
const LogReadBatch = 512

// LogReadTimeout bounds a whole-log read whose context has no deadline: a
// batch get can stop early without an error, so every read has a deadline
// and a completeness check (docs/design.md §4).
const LogReadTimeout = 30 * time.Second

// LogReadAttemptTimeout bounds one attempt of a whole-log read; a failed or
// timed-out attempt reads again from the start within the read's deadline.
const LogReadAttemptTimeout = LogReadTimeout / 3

// PutHeader stores a session's immutable header. The publish expects the
// subject to be empty (last subject sequence 0), so an id is used once, ever;
// a second header for the same id is ErrConflict.
func (s *Store) PutHeader(ctx context.Context, h protocol.SessionHeader) error {
	data, err := protocol.Marshal(protocol.Msgpack, h)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(s.Subj.Session(h.ID))
	msg.Data = data
	// The msg id is this call's own, so two writers racing for one id are
	// never deduplicated into each other; only one can land.
	msgID := "hdr." + h.ID + "." + nuid.Next()
	err = retry(ctx, func(ctx context.Context, unknown bool) error {
		_, err := s.JS.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(0), jetstream.WithMsgID(msgID))
		if err == nil || !isWrongLastSeq(err) {
			return err
		}
		// A retried publish that actually landed comes back as a conflict
		// (docs/design.md §12): it is ours if the stored header carries our msg
		// id; no header yet means a write was in flight (10164): again.
		m, gerr := s.leaderLast(ctx, s.Subj.StreamSessions(), s.Subj.Session(h.ID))
		switch {
		case errors.Is(gerr, jetstream.ErrMsgNotFound):
			return errBusy
		case gerr != nil:
			return gerr // transient: ask again; otherwise the caller sees it
		case m.Header.Get(jetstream.MsgIDHeader) == msgID:
			return nil
		}
		return fmt.Errorf("%w: session %s already has a header", ErrConflict, h.ID)
	})
	if err == nil {
		// The writer knows the session's scope from now on (its first
		// inbox item's wake-up, its lease) without reading it back.
		s.rememberHeader(h)
	}
	return err
}

// GetHeader reads a session's header; ErrNotFound when the id was never used.
func (s *Store) GetHeader(ctx context.Context, id string) (protocol.SessionHeader, error) {
	var h protocol.SessionHeader
	var m *jetstream.RawStreamMsg
	err := Retry(ctx, func(ctx context.Context) (err error) {
		m, err = s.Sessions.GetLastMsgForSubject(ctx, s.Subj.Session(id))
		return err
	})
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return h, ErrNotFound
		}
		return h, err
	}
	if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &h); err != nil {
		return h, fmt.Errorf("decode header of %s: %w", id, err)
	}
	return h, nil
}

// SessionLog is a session's event log as read from its scope's log stream: every event in
// order, and the stream sequence of its last record (0 when empty), which the
// next fenced append must name.
type SessionLog struct {
	Events      []protocol.SessionEvent
	LastSubjSeq uint64
}

// ReadLog reads a session's whole log with batch direct gets, checking that it
// reached the subject's last record and that event seqs are contiguous from 0.
// scope is the session's (protocol.SessionHeader.Scope), which names its log
// subject: take it from the session's header, or know it (a worker reads
// the logs of its own provider's children).
func (s *Store) ReadLog(ctx context.Context, scope, id string) (SessionLog, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, LogReadTimeout)
		defer cancel()
	}
	// A read is idempotent: a transient failure reads the whole log again.
	// An attempt may take a third of the read's deadline (a long log).
	// Records a lagging replica lacks come from the stream's leader
	// (readRecords).
	var out SessionLog
	err := retryEach(ctx, LogReadAttemptTimeout, func(ctx context.Context, _ bool) (err error) {
		out, err = s.readLog(ctx, scope, id)
		return err
	})
	return out, err
}

// logSubject is session id's log subject in scope, an error for a session
// without one (a child header written without its provider).
func (s *Store) logSubject(scope, id string) (string, error) {
	if !protocol.ValidID(scope) {
		return "", fmt.Errorf("session %s: its header names no provider, so its log has no subject", id)
	}
	return s.Subj.Log(scope, id), nil
}

func (s *Store) readLog(ctx context.Context, scope, id string) (SessionLog, error) {
	var out SessionLog
	subject, err := s.logSubject(scope, id)
	if err != nil {
		return out, err
	}
	// The last record comes from the stream's leader: a replica that is not
	// yet current (after a restart or a partition) answers a direct get with
	// an older last record, and a log read up to it looks whole, so the next
	// fenced append, naming that record, is refused as if another writer had
	// appended (chaos seed 1 of make test: a cold-resumed activation stopped
	// "fenced" while its lease was its own, and its messages waited for good).
	// The records up to it may come from any replica: one that lacks some
	// makes the read incomplete, and it is read again from the leader.
	last, err := s.leaderLast(ctx, s.Subj.StreamLog(scope), subject)
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		return out, fmt.Errorf("read log %s: %w", id, err)
	}
	out.Events, err = s.readRecords(ctx, scope, subject, id, 1, last, 0)
	out.LastSubjSeq = last.Sequence
	return out, err
}

// ReadLogTail reads the end of a session's log without reading all of it:
// the session's records in a window of the stream before its last record,
// widened (×8, from LogTailWindow stream sequences) until enough(events)
// holds or the window reaches the stream's start (then the events are the
// whole log, and whole is true). Events are contiguous and in order; the
// first may have any seq. An empty log gives no events and whole true. scope
// is the session's, as for ReadLog.
func (s *Store) ReadLogTail(ctx context.Context, scope, id string, enough func([]protocol.SessionEvent) bool) (events []protocol.SessionEvent, whole bool, err error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, LogReadTimeout)
		defer cancel()
	}
	// Transient failures read again, as ReadLog does.
	err = retryEach(ctx, LogReadAttemptTimeout, func(ctx context.Context, _ bool) (err error) {
		events, whole, err = s.readLogTail(ctx, scope, id, enough, false)
		return err
	})
	return events, whole, err
}

// readLogTail is one attempt of ReadLogTail; leader reads the log's last
// record from the stream's leader (what a decision on a record just
// appended needs: a replica that is not yet current answers without it).
func (s *Store) readLogTail(ctx context.Context, scope, id string, enough func([]protocol.SessionEvent) bool, leader bool) (events []protocol.SessionEvent, whole bool, err error) {
	subject, err := s.logSubject(scope, id)
	if err != nil {
		return nil, false, err
	}
	var last *jetstream.RawStreamMsg
	if leader {
		last, err = s.leaderLast(ctx, s.Subj.StreamLog(scope), subject)
	} else {
		var str jetstream.Stream
		if str, err = s.LogStream(ctx, scope); err != nil {
			return nil, false, err
		}
		last, err = str.GetLastMsgForSubject(ctx, subject)
	}
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, true, nil
		}
		return nil, false, fmt.Errorf("read log %s: %w", id, err)
	}
	for window := uint64(LogTailWindow); ; window *= 8 {
		from := uint64(1)
		if last.Sequence > window {
			from = last.Sequence - window
		}
		first := int64(-1)
		if from == 1 {
			first = 0 // the whole log: it starts at seq 0
		}
		events, err = s.readRecords(ctx, scope, subject, id, from, last, first)
		if err != nil || from == 1 || enough(events) {
			return events, from == 1 && err == nil, err
		}
	}
}

// LogTailWindow is the first window (in stream sequences) ReadLogTail reads.
const LogTailWindow = 256

// readRecords reads session id's records (on its log subject, in scope's
// log stream) with stream
// sequences in [from, last.Sequence], last being the subject's last record,
// and flattens them into events. firstSeq is the seq the first event must
// have (-1: any); every later event must follow the one before it.
//
// Records come in batch direct gets, which any replica may answer; one that
// is not yet current (after a restart, a partition or an election) answers
// without the records it lacks and stops early. The next record then comes
// from the stream's leader ($JS.API.STREAM.MSG.GET with next_by_subj, a read
// every NATS user of Brood that reads a log may do), and the read goes on
// in batches (another replica may answer the next). No log read creates a
// consumer: worker users may not (docs/security.md), and an ordered
// consumer here was refused to them (issue 16: a worker's cold resume
// during an election).
//
// The batch gets ask for payloads only (JSApiMsgGetRequest no_hdr,
// nats-server 2.11+): otherwise the server generates six headers per record
// (stream, subject, sequence, time stamp, pending, last sequence) and the
// client parses them and the time stamp, which made a 10,000-event read
// about twice a bare ordered consumer's (issue 12). So the read ends at the
// record holding the last record's last event (event seqs are contiguous
// and grow with stream sequences), and each next batch starts after the
// stream sequence its predecessor's end-of-batch message names.
func (s *Store) readRecords(ctx context.Context, scope, subject, id string, from uint64, last *jetstream.RawStreamMsg, firstSeq int64) ([]protocol.SessionEvent, error) {
	var tail protocol.LogRecord
	if err := protocol.Unmarshal(protocol.Msgpack, last.Data, &tail); err != nil {
		return nil, fmt.Errorf("decode log record %s@%d: %w", id, last.Sequence, err)
	}
	if len(tail.Events) == 0 {
		return nil, fmt.Errorf("log %s: its last record %d holds no event", id, last.Sequence)
	}
	lastSeq := tail.Events[len(tail.Events)-1].Seq
	var events []protocol.SessionEvent
	if firstSeq >= 0 && lastSeq >= firstSeq {
		events = make([]protocol.SessionEvent, 0, min(lastSeq-firstSeq+1, logEventsPreallocMax))
	}
	want := firstSeq
	add := func(data []byte) (err error) {
		events, err = addRecord(events, &want, id, 0, data)
		return err
	}
	b, err := s.newBatchReader(s.Subj.StreamLog(scope), subject, id)
	if err != nil {
		return nil, err
	}
	defer b.close()
	for next := from; want <= lastSeq; {
		got, reached, err := b.read(ctx, next, lastSeq, &want, add)
		switch {
		case err != nil:
			return events, err
		case want > lastSeq:
			return events, nil
		case got > 0:
			next = reached + 1
			continue
		}
		// The replica that answered lacks the record at next: that one
		// from the leader, then batches again (another replica may answer).
		m, err := s.leaderGetMsg(ctx, s.Subj.StreamLog(scope), map[string]any{"seq": next, "next_by_subj": subject})
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				err = fmt.Errorf("%w: the leader has no record from stream seq %d before the last record %d", ErrIncompleteRead, next, last.Sequence)
			}
			return events, fmt.Errorf("read log %s at stream seq %d: %w", id, next, err)
		}
		if m.Sequence > last.Sequence {
			return events, fmt.Errorf("read log %s: %w: the leader's next record from stream seq %d is %d, past the last record %d", id, ErrIncompleteRead, next, m.Sequence, last.Sequence)
		}
		if err := add(m.Data); err != nil {
			return events, err
		}
		next = m.Sequence + 1
	}
	return events, nil
}

// logEventsPreallocMax bounds the events a whole-log read makes room for at
// once (the count its last record names, which a damaged record could
// overstate).
const logEventsPreallocMax = 1 << 20

// batchReader reads one subject's records in batch direct gets, answered
// on one inbox of its own.
type batchReader struct {
	s           *Store
	subject, id string
	api         string
	inbox       string
	sub         *nats.Subscription
	withHeaders bool // a faulted store's reads (Faults.Lagging) need each record's sequence
}

func (s *Store) newBatchReader(stream, subject, id string) (*batchReader, error) {
	inbox := s.NC.NewInbox()
	sub, err := s.NC.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("read log %s: %w", id, err)
	}
	return &batchReader{s: s, subject: subject, id: id, api: s.directGetSubject(stream),
		inbox: inbox, sub: sub, withHeaders: s.lagging != nil}, nil
}

func (b *batchReader) close() { _ = b.sub.Unsubscribe() }

// read asks for one batch of records from stream sequence next on and
// passes each to add until the record holding event lastSeq (want is the
// event seq add expects next). got is how many records it passed, reached
// the stream sequence the batch ended at (the end-of-batch message's last
// sequence; with headers, the last record passed). A batch that found no
// record from next on (404) passes none.
func (b *batchReader) read(ctx context.Context, next uint64, lastSeq int64, want *int64, add func([]byte) error) (got int, reached uint64, err error) {
	req, err := json.Marshal(directBatchRequest{Seq: next, NextFor: b.subject, Batch: LogReadBatch, NoHeaders: !b.withHeaders})
	if err != nil {
		return 0, 0, err
	}
	if err := b.s.NC.PublishRequest(b.api, b.inbox, req); err != nil {
		return 0, 0, fmt.Errorf("read log %s: %w", b.id, err)
	}
	lagging := false
	for {
		m, err := b.sub.NextMsgWithContext(ctx)
		if err != nil {
			return got, reached, fmt.Errorf("read log %s at stream seq %d: %w", b.id, next, err)
		}
		if status := m.Header.Get(statusHeader); status != "" && len(m.Data) == 0 {
			switch status {
			case statusNoContent: // the batch's end
				if !b.withHeaders {
					eob, err := strconv.ParseUint(m.Header.Get(jetstream.LastSequenceHeader), 10, 64)
					if err != nil || (got > 0 && eob < next) {
						return got, reached, fmt.Errorf("read log %s: a batch's end names last sequence %q", b.id, m.Header.Get(jetstream.LastSequenceHeader))
					}
					reached = eob
				}
				return got, reached, nil
			case statusNotFound:
				return got, reached, nil
			default:
				return got, reached, fmt.Errorf("read log %s at stream seq %d: %s %s", b.id, next, status, m.Header.Get(descriptionHeader))
			}
		}
		if lagging || *want > lastSeq {
			continue // past what is read: the batch's end follows
		}
		if b.withHeaders {
			seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
			if err != nil {
				return got, reached, fmt.Errorf("read log %s: a record without its sequence: %w", b.id, err)
			}
			if lagging = b.s.lagging(seq); lagging {
				continue // the replica lacks it, and every later one
			}
			reached = seq
		}
		if err := add(m.Data); err != nil {
			return got, reached, err
		}
		got++
	}
}

// directBatchRequest is a $JS.API.DIRECT.GET batch request
// (nats-server's JSApiMsgGetRequest): batch records from stream sequence
// seq on subject next_by_subj, their payloads only when no_hdr is set.
type directBatchRequest struct {
	Seq       uint64 `json:"seq,omitempty"`
	NextFor   string `json:"next_by_subj,omitempty"`
	Batch     int    `json:"batch,omitempty"`
	NoHeaders bool   `json:"no_hdr,omitempty"`
}

// The status headers of direct get answers.
const (
	statusHeader      = "Status"
	descriptionHeader = "Description"
	statusNoContent   = "204" // a batch's end (EOB)
	statusNotFound    = "404" // no record from the sequence asked
)

// directGetSubject is the direct get API subject of stream, under the
// JetStream API prefix of s.JS.
func (s *Store) directGetSubject(stream string) string {
	prefix := s.JS.Options().APIPrefix
	if prefix == "" {
		prefix = jetstream.DefaultAPIPrefix
	}
	if !strings.HasSuffix(prefix, ".") {
		prefix += "."
	}
	return prefix + "DIRECT.GET." + stream
}

// addRecord appends the events of one log record (stream sequence seq) to
// events; want is the seq the next event must have (-1: any) and is advanced.
func addRecord(events []protocol.SessionEvent, want *int64, id string, seq uint64, data []byte) ([]protocol.SessionEvent, error) {
	var rec protocol.LogRecord
	if err := protocol.Unmarshal(protocol.Msgpack, data, &rec); err != nil {
		return events, fmt.Errorf("decode log record %s@%d: %w", id, seq, err)
	}
	for _, ev := range rec.Events {
		if *want >= 0 && ev.Seq != *want {
			return events, fmt.Errorf("log %s is not contiguous: event seq %d where %d was due", id, ev.Seq, *want)
		}
		*want = ev.Seq + 1
		events = append(events, ev)
	}
	return events, nil
}

// LogWriter appends records to one session's log. It is the single writer's
// handle: every append names the stream sequence of the previous record
// (Nats-Expected-Last-Subject-Sequence), so a second writer's append, or ours
// after someone took the session over, is refused with ErrFenced. Not safe
// for concurrent use: a session never pipelines its conditional appends.
type LogWriter struct {
	s           *Store
	sessionID   string
	subject     string
	stream      string // the log stream of the session's scope
	lastSubjSeq uint64
	nextSeq     int64
	fenced      bool
	// token makes this writer's Nats-Msg-Ids its own: two writers appending
	// the same event seq must not be deduplicated into one another.
	token string
}

// NewLogWriter returns a writer continuing the log of session sessionID of
// scope (protocol.SessionHeader.Scope: a worker writes its own provider's
// children's logs, a client or trusted host its roots') whose last record is
// at stream sequence lastSubjSeq (0 for an empty log) and whose next event
// seq is nextSeq.
func (s *Store) NewLogWriter(scope, sessionID string, lastSubjSeq uint64, nextSeq int64) *LogWriter {
	return &LogWriter{s: s, sessionID: sessionID, subject: s.Subj.Log(scope, sessionID), stream: s.Subj.StreamLog(scope),
		lastSubjSeq: lastSubjSeq, nextSeq: nextSeq, token: nuid.Next()}
}

// NextSeq is the seq the next appended event gets.
func (w *LogWriter) NextSeq() int64 { return w.nextSeq }

// LastSubjSeq is the stream sequence of the last record written or read.
func (w *LogWriter) LastSubjSeq() uint64 { return w.lastSubjSeq }

// Append assigns seqs to evs, writes them as one record and returns them. It
// returns ErrFenced when another writer appended since our last record (the
// caller must stop using this session), and a LIMIT_EXCEEDED protocol error
// when the record is larger than the stream's max message size.
func (w *LogWriter) Append(ctx context.Context, evs ...protocol.SessionEvent) ([]protocol.SessionEvent, error) {
	if w.fenced {
		return nil, ErrFenced
	}
	if len(evs) == 0 {
		return nil, nil
	}
	out := make([]protocol.SessionEvent, len(evs))
	for i, ev := range evs {
		ev.Seq = w.nextSeq + int64(i)
		out[i] = ev
	}
	data, err := protocol.Marshal(protocol.Msgpack, protocol.LogRecord{Events: out})
	if err != nil {
		return nil, err
	}
	// Leave room for headers and the subject within the max message size.
	if limit := int(w.s.Cfg.MsgBytesMax) - 1024; len(data) > limit {
		return nil, protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
			"limit":  "log record bytes",
			"reason": fmt.Sprintf("a record of %d events is %d bytes, over the %d-byte limit", len(out), len(data), limit),
		})
	}
	msg := nats.NewMsg(w.subject)
	msg.Data = data
	msgID := w.sessionID + "." + strconv.FormatInt(out[0].Seq, 10) + "." + w.token
	var seq uint64
	err = retry(ctx, func(ctx context.Context, unknown bool) error {
		ack, err := w.s.JS.PublishMsg(ctx, msg,
			jetstream.WithExpectLastSequencePerSubject(w.lastSubjSeq), jetstream.WithMsgID(msgID))
		if err == nil {
			seq = ack.Sequence
			return nil
		}
		if !isWrongLastSeq(err) {
			return err
		}
		// Refused: ours if a retry of a publish that landed; the log as we
		// left it if another write was in flight (10164): again; else
		// another writer appended: fenced.
		m, gerr := w.s.leaderLast(ctx, w.stream, w.subject)
		switch {
		case errors.Is(gerr, jetstream.ErrMsgNotFound) && w.lastSubjSeq == 0:
			return errBusy
		case gerr != nil:
			return gerr
		case m.Header.Get(jetstream.MsgIDHeader) == msgID:
			seq = m.Sequence
			return nil
		case m.Sequence == w.lastSubjSeq:
			return errBusy
		}
		return errFencedAt
	})
	if err != nil && Transient(err) {
		// The budget ran out on an unknown outcome: one last look.
		if s, ok := w.landed(msgID); ok {
			seq, err = s, nil
		}
	}
	switch {
	case errors.Is(err, errFencedAt):
		w.fenced = true
		return nil, fmt.Errorf("%w: session %s (expected last record %d)", ErrFenced, w.sessionID, w.lastSubjSeq)
	case err != nil:
		return nil, fmt.Errorf("append to log %s: %w", w.sessionID, err)
	}
	w.lastSubjSeq = seq
	w.nextSeq += int64(len(out))
	return out, nil
}

// errFencedAt is an append refused because another writer's record is last.
var errFencedAt = errors.New("fenced")

// landedWait bounds the last look at the log after an append's budget ran out.
const landedWait = 2 * time.Second

// landed checks, after an append whose outcome stayed unknown, whether the
// record is in fact the subject's last message (a publish whose ack was
// lost, docs/design.md §12).
func (w *LogWriter) landed(msgID string) (uint64, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), landedWait)
	defer cancel()
	m, err := w.s.leaderLast(ctx, w.stream, w.subject)
	if err != nil || m.Header.Get(jetstream.MsgIDHeader) != msgID {
		return 0, false
	}
	return m.Sequence, true
}

// PublishEvent publishes a lifecycle event to BROOD_EVENTS without waiting on
// the caller's path, on its provider's subject
// (protocol.Subjects.Events: a deployment lets a worker publish only its
// own provider's); a failed acknowledgement, or an event that names no
// valid provider or parent, is reported to onErr. The
// returned channel is closed once the event is stored or given up on: a
// host publishes a run's subagent/end only after its subagent/start, so the
// stream holds them in that order even when the start had to be retried.
func (s *Store) PublishEvent(ev protocol.LifecycleEvent, onErr func(error)) <-chan struct{} {
	kind := protocol.EventKindStart
	if ev.Type == protocol.LifecycleEnd {
		kind = protocol.EventKindEnd
	}
	done := make(chan struct{})
	data, err := protocol.Marshal(protocol.Msgpack, ev)
	if err == nil && (!protocol.ValidID(ev.Provider) || !protocol.ValidID(ev.ParentSession)) {
		err = fmt.Errorf("lifecycle event %s of run %s names no valid provider (%q) or parent (%q)", ev.Type, ev.RunID, ev.Provider, ev.ParentSession)
	}
	if err != nil {
		onErr(err)
		close(done)
		return done
	}
	msg := nats.NewMsg(s.Subj.Events(ev.Provider, ev.ParentSession, kind))
	msg.Data = data
	// The msg id makes a retried publish of the same edge count once. It
	// names the provider: a worker, which publishes under its own
	// provider's subjects only, cannot take the id of another provider's
	// run's event first (the stream would drop the true one as a duplicate).
	msg.Header.Set(jetstream.MsgIDHeader, "ev."+ev.Provider+"."+ev.RunID+"."+kind)
	s.publishAsync(msg, "lifecycle event", onErr, done)
	return done
}

// RecordBytesTarget is the size AppendChunked aims each record at, well under
// the max message size.
const RecordBytesTarget = 256 << 10

// Appender is anything that appends records to a session log.
type Appender interface {
	Append(ctx context.Context, evs ...protocol.SessionEvent) ([]protocol.SessionEvent, error)
}

// AppendChunked appends many events as consecutive records of about
// RecordBytesTarget each (a fork seed), returning them with their seqs.
func AppendChunked(ctx context.Context, w Appender, evs []protocol.SessionEvent) ([]protocol.SessionEvent, error) {
	var out []protocol.SessionEvent
	start, size := 0, 0
	flush := func(end int) error {
		if end == start {
			return nil
		}
		written, err := w.Append(ctx, evs[start:end]...)
		if err != nil {
			return err
		}
		out = append(out, written...)
		start, size = end, 0
		return nil
	}
	for i, ev := range evs {
		n := len(ev.Data) + len(ev.Type) + 32
		if size+n > RecordBytesTarget {
			if err := flush(i); err != nil {
				return out, err
			}
		}
		size += n
	}
	return out, flush(len(evs))
}

// PutChildIndex records a child in its parent's child index (once per child),
// retrying transient failures.
func (s *Store) PutChildIndex(ctx context.Context, parent string, rec protocol.ChildIndexRecord) error {
	data, err := protocol.Marshal(protocol.Msgpack, rec)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(s.Subj.Children(parent, rec.ChildID))
	msg.Data = data
	return Retry(ctx, func(ctx context.Context) error {
		_, err := s.JS.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(0))
		if err != nil && isWrongLastSeq(err) {
			return nil // already indexed (by us, or an earlier attempt)
		}
		return err
	})
}

// PutChildIndexAsync is PutChildIndex off the caller's path: the index serves
// listings, which tolerate an entry arriving a moment after the header.
func (s *Store) PutChildIndexAsync(parent string, rec protocol.ChildIndexRecord, onErr func(error)) {
	data, err := protocol.Marshal(protocol.Msgpack, rec)
	if err != nil {
		onErr(err)
		return
	}
	msg := nats.NewMsg(s.Subj.Children(parent, rec.ChildID))
	msg.Data = data
	s.publishAsync(msg, "child index entry", func(err error) {
		if !isWrongLastSeq(err) { // already indexed
			onErr(err)
		}
	}, nil, jetstream.WithExpectLastSequencePerSubject(0))
}

// ChildIndex returns a parent's child index in creation order.
func (s *Store) ChildIndex(ctx context.Context, parent string) ([]protocol.ChildIndexRecord, error) {
	var out []protocol.ChildIndexRecord
	next := uint64(1)
	for {
		msgs, err := jetstreamext.GetBatch(ctx, s.JS, s.Subj.StreamSessions(), 256,
			jetstreamext.GetBatchSubject(s.Subj.ChildrenOf(parent)), jetstreamext.GetBatchSeq(next))
		if err != nil {
			return nil, fmt.Errorf("read the child index of %s: %w", parent, err)
		}
		got := 0
		for m, err := range msgs {
			if err != nil {
				if errors.Is(err, jetstreamext.ErrNoMessages) {
					break
				}
				return nil, fmt.Errorf("read the child index of %s: %w", parent, err)
			}
			var rec protocol.ChildIndexRecord
			if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &rec); err == nil {
				out = append(out, rec)
			}
			next = m.Sequence + 1
			got++
		}
		if got < 256 {
			return out, nil
		}
	}
}

// AckWaitMax bounds the wait for the acknowledgement of one publish made off
// the caller's path.
const AckWaitMax = 10 * time.Second

// AsyncBudget bounds the retries of a publish made off the caller's path
// (lifecycle events, child index entries) through an election: they carry a
// Nats-Msg-Id or an expected sequence, so a retry is stored once.
const AsyncBudget = 30 * time.Second

// publishAsync publishes msg without waiting on the caller's path; transient
// failures (retry.go) are retried within AsyncBudget, and a refused or
// missing acknowledgement after that is reported to onErr.
// done (when not nil) is closed once the message is stored or given up on.
func (s *Store) publishAsync(msg *nats.Msg, what string, onErr func(error), done chan struct{}, opts ...jetstream.PublishOpt) {
	fut, err := s.JS.PublishMsgAsync(copyMsg(msg), opts...)
	if err != nil && !Transient(err) {
		onErr(err)
		if done != nil {
			close(done)
		}
		return
	}
	go func() {
		if done != nil {
			defer close(done)
		}
		deadline := time.Now().Add(AsyncBudget)
		wait := retryWaitMin
		for {
			if err == nil {
				t := time.NewTimer(AckWaitMax)
				select {
				case <-fut.Ok():
					t.Stop()
					return
				case err = <-fut.Err():
				case <-t.C:
					err = fmt.Errorf("no acknowledgement of the %s within %s: %w", what, AckWaitMax, nats.ErrTimeout)
				}
				t.Stop()
			}
			if !Transient(err) || time.Now().Add(wait).After(deadline) {
				onErr(err)
				return
			}
			time.Sleep(wait)
			wait = min(2*wait, retryWaitMax)
			fut, err = s.JS.PublishMsgAsync(copyMsg(msg), opts...)
		}
	}()
}

// copyMsg is msg as a new message (an async publish takes ownership of it).
func copyMsg(m *nats.Msg) *nats.Msg {
	c := nats.NewMsg(m.Subject)
	c.Data = m.Data
	for k, v := range m.Header {
		c.Header[k] = append([]string(nil), v...)
	}
	return c
}

// ChildIndexEntry returns one child's entry in its parent's child index
// (ErrNotFound when there is none yet: one-shot entries are written off the
// start's path).
func (s *Store) ChildIndexEntry(ctx context.Context, parent, child string) (protocol.ChildIndexRecord, error) {
	var rec protocol.ChildIndexRecord
	m, err := s.Sessions.GetLastMsgForSubject(ctx, s.Subj.Children(parent, child))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return rec, ErrNotFound
	}
	if err != nil {
		return rec, err
	}
	err = protocol.Unmarshal(protocol.Msgpack, m.Data, &rec)
	return rec, err
}
