package store

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/tracecontext"
)

// The inbox (docs/design.md §4). Each session's pending items are the messages on
// its inbox subject, in its scope's stream BROOD_INBOX_<scope> (streams.go); an item is deleted once its claim is logged in the
// session log, so the subject holds exactly what is pending. Agents read it
// with direct gets after the last inbox sequence their log claimed, and wake
// on core subscriptions to the same subject and to the session's wake
// subject (published after the item was acknowledged): no consumer, no
// acks, nothing per agent on the server. (An ordered consumer per resident agent would cost
// about 30 KB and 7 goroutines, and a stream allows 1,000 consumers unless
// raised; 10,000 resident agents would not fit.)

// Inbox item deliveries (protocol.Delivery*).
const (
	DeliveryNextTurn = protocol.DeliveryNextTurn
	DeliveryNextStep = protocol.DeliveryNextStep
	DeliveryQuiet    = protocol.DeliveryQuiet
)

// InboxItem is one pending inbox item (protocol.InboxItem): the body of a
// message of an inbox stream; Seq (its stream sequence, in its scope's
// stream) is set when read and never stored.
type InboxItem = protocol.InboxItem

// Enqueue accepts an item into the inbox of session sessionID of scope scope
// (its header's Scope) and returns its messageId and inbox sequence. A non-empty idempotencyKey becomes the Nats-Msg-Id, so
// a retry inside the duplicate window answers with the original messageId. A
// full inbox (InboxItemsMax pending) is LIMIT_EXCEEDED.
func (s *Store) Enqueue(ctx context.Context, scope, sessionID string, item InboxItem, idempotencyKey string) (string, protocol.Seq, error) {
	in := s.InboxOf(scope, sessionID)
	str, err := in.stream(ctx)
	if err != nil {
		return "", 0, err
	}
	derived := false
	switch {
	case item.MessageID != "":
	case idempotencyKey != "":
		item.MessageID, derived = KeyedMessageID(sessionID, idempotencyKey), true
	default:
		item.MessageID = ulid.Make().String()
	}
	item.Seq = 0 // the stream assigns it
	if item.Delivery == "" {
		item.Delivery = DeliveryNextTurn
	}
	data, err := protocol.Marshal(protocol.Msgpack, item)
	if err != nil {
		return "", 0, err
	}
	msg := nats.NewMsg(in.Subject())
	msg.Data = data
	msg.Header.Set(protocol.HeaderMessageID, item.MessageID)
	tracecontext.Inject(ctx, msg.Header)
	// The msg id makes a retry store the item once: the caller's key, else
	// the item's own messageId (a key has no dot, so the two never collide).
	msgID := sessionID + ".m." + item.MessageID
	if idempotencyKey != "" {
		msgID = sessionID + "." + idempotencyKey
	}
	var ack *jetstream.PubAck
	err = Retry(ctx, func(ctx context.Context) (err error) {
		ack, err = s.JS.PublishMsg(ctx, msg, jetstream.WithMsgID(msgID))
		return err
	})
	if err != nil {
		// The server answers a full subject with discard-new-per-subject as
		// "maximum messages per subject exceeded" (nats-server ErrMaxMsgsPerSubject).
		if strings.Contains(strings.ToLower(err.Error()), "maximum messages per subject") {
			return "", 0, protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
				"limit": "inbox items", "reason": fmt.Sprintf("session %s already has %d pending items", sessionID, s.Cfg.InboxItemsMax)})
		}
		return "", 0, err
	}
	if ack.Duplicate && derived {
		return item.MessageID, protocol.Seq(ack.Sequence), nil // the original's id is this one
	}
	if ack.Duplicate && idempotencyKey != "" {
		// The original item may already be claimed (and deleted); its id is
		// only needed when it is still there.
		if m, gerr := str.GetMsg(ctx, ack.Sequence); gerr == nil {
			return m.Header.Get(protocol.HeaderMessageID), protocol.Seq(ack.Sequence), nil
		}
		// Already claimed (and so deleted): its claim in the log names it.
		if id := s.claimedMessageID(ctx, scope, sessionID, protocol.Seq(ack.Sequence)); id != "" {
			return id, protocol.Seq(ack.Sequence), nil
		}
		return "", protocol.Seq(ack.Sequence), protocol.Errorf(protocol.CodeUnavailable,
			"idempotency key %q was already used; its message could not be found again, retry later", idempotencyKey)
	}
	// The wake-up, published once the stream acknowledged the item, comes
	// when a read finds it (activation.go). Resident activations never see
	// the item's copy on the inbox subject: their workers may not subscribe
	// to it (docs/security.md).
	s.wake(scope, sessionID)
	return item.MessageID, protocol.Seq(ack.Sequence), nil
}

// wake publishes the wake-up of session id of scope scope on its wake
// subject (protocol.Subjects.Wake). It is best effort, as every core
// publish is: an activation that misses it finds the item at its next
// re-check (worker.ActivationRecheck).
func (s *Store) wake(scope, id string) {
	_ = s.NC.Publish(s.Subj.Wake(scope, id), nil)
}

// KeyedMessageID is the messageId of an item enqueued with idempotencyKey
// (and no messageId of its own): derived from the session and the key, so
// every retry carries the original's id. JetStream's duplicate window
// (Nats-Msg-Id) stores a retry once only while the stream remembers the
// original's msg id, and a node restarted from its store rebuilds that
// memory from the messages it still holds: an item already claimed (and so
// deleted) is forgotten, and a retry through such a leader is stored again.
// A claim skips an item whose messageId its session's log already claimed
// or discarded (agent.UnclaimedOf), so the copy is never run twice.
func KeyedMessageID(sessionID, idempotencyKey string) string {
	sum := sha256.Sum256([]byte(sessionID + "\x00" + idempotencyKey))
	var id ulid.ULID
	copy(id[:], sum[:len(id)])
	return id.String()
}

// errCodeSequenceNotFound is JetStream's answer (10043) to the deletion of a
// message a replicated stream no longer holds.
const errCodeSequenceNotFound = 10043

// errCodeMsgDeleteFailed is JetStream's answer (10057, nats-server
// JSStreamMsgDeleteFailedF) to a deletion that failed, with the store's
// reason as its description: "no message found" when a single-replica
// stream no longer holds the message (as in `brood dev`).
const errCodeMsgDeleteFailed = 10057

// alreadyDeleted reports a deletion refused because the message is gone.
func alreadyDeleted(err error) bool {
	var apiErr *jetstream.APIError
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true
	}
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == errCodeSequenceNotFound ||
		(apiErr.ErrorCode == errCodeMsgDeleteFailed && strings.Contains(apiErr.Description, "no message found"))
}

// errCodeRE finds the JetStream error code in an error's text.
var errCodeRE = regexp.MustCompile(`err_code=(\d+)`)

// deleteError returns a refused message deletion with its JetStream API error
// as a value (nats.go wraps only its text), so Transient and the not-found
// codes can be told apart.
func deleteError(err error) error {
	if !errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		return err
	}
	m := errCodeRE.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	code, _ := strconv.Atoi(m[1])
	return fmt.Errorf("%w (%w)", err, &jetstream.APIError{ErrorCode: jetstream.ErrorCode(code), Description: err.Error()})
}

// SessionInbox reads and trims one session's inbox.
type SessionInbox struct {
	s                *Store
	scope, sessionID string
	// remove carries out Remove when set (RemovedBy); nil deletes directly.
	remove func(ctx context.Context, seqs []protocol.Seq) error
}

// RemovedBy returns the inbox with its removals carried out by remove: a
// worker host asks the coordinators (protocol.Subjects.InboxRemove), since
// only they delete inbox items in a deployment (docs/security.md). Reads
// are unchanged.
func (in *SessionInbox) RemovedBy(remove func(ctx context.Context, seqs []protocol.Seq) error) *SessionInbox {
	return &SessionInbox{s: in.s, scope: in.scope, sessionID: in.sessionID, remove: remove}
}

// InboxOf returns the inbox of session sessionID of scope scope (its
// header's Scope: its provider, or protocol.ScopeRoot), in the stream
// BROOD_INBOX_<scope>.
func (s *Store) InboxOf(scope, sessionID string) *SessionInbox {
	return &SessionInbox{s: s, scope: scope, sessionID: sessionID}
}

// Subject is the inbox subject (a core subscription on it wakes the agent).
func (in *SessionInbox) Subject() string { return in.s.Subj.Inbox(in.scope, in.sessionID) }

// stream is the inbox's stream, its scope's.
func (in *SessionInbox) stream(ctx context.Context) (jetstream.Stream, error) {
	return in.s.InboxStream(ctx, in.scope)
}

// Pending returns the items with a sequence above after, oldest first, or
// an error: never fewer items than the inbox holds. (A batch direct get
// ends without an error when its deadline passes, the connection's request
// timeout when ctx has none, so each answer is checked: every item carries
// how many more match, Nats-Num-Pending, and an answer with neither an item
// nor the server's "no messages" is an error.)
// Transient failures read again (retry.go).
func (in *SessionInbox) Pending(ctx context.Context, after protocol.Seq) ([]InboxItem, error) {
	var out []InboxItem
	err := retryEach(ctx, LogReadAttemptTimeout, func(ctx context.Context, _ bool) (err error) {
		out, err = in.pending(ctx, after)
		return err
	})
	return out, err
}

func (in *SessionInbox) pending(ctx context.Context, after protocol.Seq) ([]InboxItem, error) {
	var out []InboxItem
	next := uint64(after) + 1
	for {
		msgs, err := jetstreamext.GetBatch(ctx, in.s.JS, in.s.Subj.StreamInbox(in.scope), InboxReadBatch,
			jetstreamext.GetBatchSubject(in.Subject()), jetstreamext.GetBatchSeq(next))
		if err != nil {
			return nil, fmt.Errorf("read inbox %s: %w", in.sessionID, err)
		}
		got, more, none := 0, uint64(0), false
		for m, err := range msgs {
			if err != nil {
				if errors.Is(err, jetstreamext.ErrNoMessages) {
					none = true
					break
				}
				return nil, fmt.Errorf("read inbox %s: %w", in.sessionID, err)
			}
			var it InboxItem
			if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &it); err != nil {
				return nil, fmt.Errorf("decode inbox item %s@%d: %w", in.sessionID, m.Sequence, err)
			}
			if more, err = strconv.ParseUint(m.Header.Get(headerNumPending), 10, 64); err != nil {
				return nil, fmt.Errorf("read inbox %s: item %d has no valid %s header", in.sessionID, m.Sequence, headerNumPending)
			}
			it.Seq = protocol.Seq(m.Sequence)
			if tp := m.Header.Get(tracecontext.HeaderTraceparent); tp != "" {
				it.Trace = map[string][]string{tracecontext.HeaderTraceparent: {tp}}
				if ts := m.Header.Get(tracecontext.HeaderTracestate); ts != "" {
					it.Trace[tracecontext.HeaderTracestate] = []string{ts}
				}
			}
			out = append(out, it)
			next = m.Sequence + 1
			got++
		}
		switch {
		case none:
			return out, nil
		case got == 0:
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("read inbox %s: %w", in.sessionID, err)
			}
			return nil, fmt.Errorf("read inbox %s: %w: no answer from the stream in time", in.sessionID, ErrIncompleteRead)
		case more == 0:
			return out, nil
		}
		// More items match: the batch was full, or its answer was cut short.
	}
}

// InboxReadBatch is how many items one direct get of an inbox asks for.
const InboxReadBatch = 256

// headerNumPending is the header of a batch direct get's answers that counts
// the matching messages after this one (nats-server JSNumPending).
const headerNumPending = "Nats-Num-Pending"

// Remove deletes claimed or discarded items; an item already gone is fine.
// An inbox made with RemovedBy hands them to its remover instead.
func (in *SessionInbox) Remove(ctx context.Context, seqs ...protocol.Seq) error {
	if len(seqs) == 0 {
		return nil
	}
	if in.remove != nil {
		if err := in.remove(ctx, seqs); err != nil {
			return fmt.Errorf("remove inbox items %s@%v: %w", in.sessionID, seqs, err)
		}
		return nil
	}
	for _, seq := range seqs {
		if err := in.s.deleteInboxItem(ctx, in.scope, seq); err != nil {
			return fmt.Errorf("remove inbox item %s@%d: %w", in.sessionID, seq, err)
		}
	}
	return nil
}

// deleteInboxItem deletes the message at seq of scope's inbox stream; one
// already gone (an earlier attempt, another claimer) is no error. Transient
// failures delete again (retry.go).
func (s *Store) deleteInboxItem(ctx context.Context, scope string, seq protocol.Seq) error {
	str, err := s.InboxStream(ctx, scope)
	if err != nil {
		return err
	}
	return Retry(ctx, func(ctx context.Context) error {
		err := deleteError(str.DeleteMsg(ctx, uint64(seq)))
		if alreadyDeleted(err) {
			return nil
		}
		return err
	})
}

// lastRecord returns the events of session h's last log record, read from
// the stream's leader (none for an empty log).
func (s *Store) lastRecord(ctx context.Context, h protocol.SessionHeader) ([]protocol.SessionEvent, error) {
	subject, err := s.logSubject(h.Scope(), h.ID)
	if err != nil {
		return nil, err
	}
	var last *jetstream.RawStreamMsg
	err = Retry(ctx, func(ctx context.Context) (err error) {
		last, err = s.leaderLast(ctx, s.Subj.StreamLog(h.Scope()), subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			last = nil
			return nil
		}
		return err
	})
	if err != nil || last == nil {
		return nil, err
	}
	anySeq := int64(-1)
	return addRecord(nil, &anySeq, h.ID, last.Sequence, last.Data)
}

// RemoveDoneInboxItems deletes the items seqs of the inbox of session h
// whose claim or discard h's log records, and returns how many it deleted
// (an item already gone does not count): what a coordinator does for the
// host of a child (protocol.Subjects.InboxRemove), since no worker deletes
// inbox items itself (docs/security.md). Each item is read from the
// stream's leader: one that holds another session's item is
// INVALID_ARGUMENT. The log is read backwards from its last record on the
// stream's leader (that record alone first, then ReadLogTail) until it
// claims or discards every item
// still there, by its sequence or by its messageId (a second copy of a
// done item, KeyedMessageID): an item it does not is UNAUTHORIZED, and
// nothing is deleted. So no accepted item leaves an inbox before its
// session's log names it (RELIABILITY.md I1).
func (s *Store) RemoveDoneInboxItems(ctx context.Context, h protocol.SessionHeader, seqs []protocol.Seq) (int, error) {
	subject := s.Subj.Inbox(h.Scope(), h.ID)
	ids := map[protocol.Seq]string{} // the items still there → their messageIds
	for _, seq := range seqs {
		var m *jetstream.RawStreamMsg
		err := Retry(ctx, func(ctx context.Context) (err error) {
			m, err = s.leaderSeq(ctx, s.Subj.StreamInbox(h.Scope()), uint64(seq))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				return nil
			}
			return err
		})
		switch {
		case err != nil:
			return 0, fmt.Errorf("read inbox item %s@%d: %w", h.ID, seq, err)
		case m == nil:
			continue // already gone
		case m.Subject != subject:
			return 0, protocol.Errorf(protocol.CodeInvalidArgument, "inbox sequence %d is not an item of session %s", seq, h.ID)
		}
		var it InboxItem
		if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &it); err != nil {
			return 0, fmt.Errorf("decode inbox item %s@%d: %w", h.ID, seq, err)
		}
		ids[seq] = it.MessageID
	}
	if len(ids) == 0 {
		return 0, nil
	}
	undone := func(events []protocol.SessionEvent) []protocol.Seq {
		_, done := sessionlog.InboxCursor(events)
		doneIDs := sessionlog.DoneMessages(events)
		var out []protocol.Seq
		for seq, id := range ids {
			if !done[seq] && (id == "" || !doneIDs[id]) {
				out = append(out, seq)
			}
		}
		slices.Sort(out)
		return out
	}
	events, err := s.lastRecord(ctx, h)
	if err != nil {
		return 0, fmt.Errorf("read the log of %s: %w", h.ID, err)
	}
	// The common case is the claim or discard just logged, the log's last
	// record; else (a predecessor's claim, whose item it left) the tail.
	if len(undone(events)) > 0 {
		err = retryEach(ctx, LogReadAttemptTimeout, func(ctx context.Context, _ bool) (err error) {
			events, _, err = s.readLogTail(ctx, h.Scope(), h.ID, func(evs []protocol.SessionEvent) bool { return len(undone(evs)) == 0 }, true)
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("read the log of %s: %w", h.ID, err)
		}
	}
	if left := undone(events); len(left) > 0 {
		return 0, protocol.Errorf(protocol.CodeUnauthorized, "inbox items %v of session %s are not claimed or discarded in its log; nothing is removed", left, h.ID)
	}
	removed := 0
	for seq := range ids {
		if err := s.deleteInboxItem(ctx, h.Scope(), seq); err != nil {
			return removed, fmt.Errorf("remove inbox item %s@%d: %w", h.ID, seq, err)
		}
		removed++
	}
	return removed, nil
}

// claimedMessageID finds the messageId of an inbox item that was claimed or
// discarded, from the session log that recorded it.
func (s *Store) claimedMessageID(ctx context.Context, scope, sessionID string, seq protocol.Seq) string {
	log, err := s.ReadLog(ctx, scope, sessionID)
	if err != nil {
		return ""
	}
	for i := len(log.Events) - 1; i >= 0; i-- {
		ev := log.Events[i]
		switch ev.Type {
		case protocol.EvInboxDequeue:
			var d protocol.InboxDequeueData
			if ev.Decode(&d) == nil && d.InboxSeq == seq {
				return d.MessageID
			}
		case protocol.EvInboxDiscard:
			var d protocol.InboxDiscardData
			if ev.Decode(&d) == nil && d.InboxSeq == seq {
				return d.MessageID
			}
		}
	}
	return ""
}

// Count returns how many items are pending in the session's inbox, from the
// stream's per-subject state (no message is read).
func (in *SessionInbox) Count(ctx context.Context) (uint64, error) {
	str, err := in.stream(ctx)
	if err != nil {
		return 0, err
	}
	info, err := str.Info(ctx, jetstream.WithSubjectFilter(in.Subject()))
	if err != nil {
		return 0, err
	}
	return info.State.Subjects[in.Subject()], nil
}
