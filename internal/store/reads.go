package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Paged reads behind the coordinator's read endpoints (sessions.log,
// events.read, events.follow, inbox.read). Each read is bounded: by a count,
// by the encoded bytes of what it returns (at least one item always
// travels), and for scans by the messages it examines. Each knows where the
// subject ended when it started (the subject's last message), so a batch get
// that stops early is an incomplete read, never a short answer.

// readBatchRecords is how many messages one batch direct get asks for.
const readBatchRecords = 64

// eventBytes estimates an event's encoded size.
func eventBytes(ev protocol.SessionEvent) int { return len(ev.Data) + len(ev.Type) + 32 }

// lastSeq returns the stream sequence of the last message on subject
// (wildcards allowed), 0 when there is none.
func lastSeq(ctx context.Context, str jetstream.Stream, subject string) (uint64, error) {
	m, err := str.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return m.Sequence, nil
}

// scan calls visit for every message on subject from stream sequence from
// up to and including last, in order, until visit returns false. It fails
// when the stream stops answering before last (an incomplete read).
func (s *Store) scan(ctx context.Context, stream, subject string, from, last uint64, batchBytes int,
	visit func(m *jetstream.RawStreamMsg) (bool, error)) error {
	next := from
	for next <= last {
		msgs, err := jetstreamext.GetBatch(ctx, s.JS, stream, readBatchRecords,
			jetstreamext.GetBatchSubject(subject), jetstreamext.GetBatchSeq(next), jetstreamext.GetBatchMaxBytes(batchBytes))
		if err != nil {
			return err
		}
		got := 0
		for m, err := range msgs {
			if err != nil {
				if errors.Is(err, jetstreamext.ErrNoMessages) {
					break
				}
				return err
			}
			if m.Sequence > last {
				return nil
			}
			got++
			next = m.Sequence + 1
			more, err := visit(m)
			if err != nil || !more {
				return err
			}
		}
		if got == 0 {
			return fmt.Errorf("%w: the stream stopped answering at sequence %d before the last message %d", ErrIncompleteRead, next, last)
		}
	}
	return nil
}

// ReadLogPage reads one page of a session's events from event seq fromSeq
// on: at most eventsMax events and about bytesMax bytes of them (one event
// always). cursor, a stream sequence from a previous page, is where the
// record holding fromSeq starts; 0 or a wrong cursor reads from the log's
// first record. scope is the session's, as for ReadLog. A transient failure
// (Transient: an election, a lost answer) reads the page again, within
// ctx's deadline (else WriteBudget), each attempt bounded as a whole-log
// read's (LogReadAttemptTimeout, at most a third of the time left).
func (s *Store) ReadLogPage(ctx context.Context, scope, id string, fromSeq int64, cursor protocol.Seq, eventsMax, bytesMax int) (protocol.LogPage, error) {
	var page protocol.LogPage
	err := retryEach(ctx, LogReadAttemptTimeout, func(ctx context.Context, _ bool) error {
		var err error
		page, err = s.readLogPage(ctx, scope, id, fromSeq, cursor, eventsMax, bytesMax)
		return err
	})
	return page, err
}

// readLogPage is one attempt of ReadLogPage.
func (s *Store) readLogPage(ctx context.Context, scope, id string, fromSeq int64, cursor protocol.Seq, eventsMax, bytesMax int) (protocol.LogPage, error) {
	page := protocol.LogPage{Events: []protocol.SessionEvent{}, NextSeq: fromSeq, Cursor: cursor}
	subject, err := s.logSubject(scope, id)
	if err != nil {
		return page, err
	}
	str, err := s.LogStream(ctx, scope)
	if err != nil {
		return page, err
	}
	lastMsg, err := str.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		page.Complete = true
		return page, nil
	}
	if err != nil {
		return page, fmt.Errorf("read log %s: %w", id, err)
	}
	last := lastMsg.Sequence
	var lastRec protocol.LogRecord
	if err := protocol.Unmarshal(protocol.Msgpack, lastMsg.Data, &lastRec); err != nil || len(lastRec.Events) == 0 {
		return page, fmt.Errorf("decode log record %s@%d: %w", id, last, err)
	}
	if fromSeq > lastRec.Events[len(lastRec.Events)-1].Seq {
		// Nothing at fromSeq yet (a tail): no scan at all.
		page.Complete, page.Cursor = true, protocol.Seq(last+1)
		return page, nil
	}
	start := uint64(cursor)
	if start == 0 || start > last {
		start = 1
	}
	for attempt := 0; attempt < 2; attempt++ {
		page.Events, page.NextSeq, page.Complete = page.Events[:0], fromSeq, false
		bytes, wrongCursor := 0, false
		page.Cursor = protocol.Seq(last + 1)
		err = s.scan(ctx, s.Subj.StreamLog(scope), subject, start, last, bytesMax, func(m *jetstream.RawStreamMsg) (bool, error) {
			var rec protocol.LogRecord
			if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &rec); err != nil {
				return false, fmt.Errorf("decode log record %s@%d: %w", id, m.Sequence, err)
			}
			for i, ev := range rec.Events {
				if ev.Seq < page.NextSeq {
					continue
				}
				if ev.Seq > page.NextSeq {
					if start > 1 && len(page.Events) == 0 {
						wrongCursor = true
						return false, nil
					}
					return false, fmt.Errorf("log %s is not contiguous: event seq %d where %d was expected", id, ev.Seq, page.NextSeq)
				}
				if len(page.Events) >= eventsMax || (len(page.Events) > 0 && bytes+eventBytes(ev) > bytesMax) {
					page.Cursor = protocol.Seq(m.Sequence)
					return false, nil
				}
				page.Events = append(page.Events, ev)
				bytes += eventBytes(ev)
				page.NextSeq = ev.Seq + 1
				if i == len(rec.Events)-1 {
					page.Cursor = protocol.Seq(m.Sequence + 1)
				}
			}
			if m.Sequence == last {
				page.Complete = true
			}
			return true, nil
		})
		if err != nil {
			return page, fmt.Errorf("read log %s: %w", id, err)
		}
		if !wrongCursor {
			return page, nil
		}
		start = 1
	}
	return page, nil
}

// LastEventSeq is the stream sequence of the last lifecycle event on subject
// (a filter with wildcards), 0 when there is none.
func (s *Store) LastEventSeq(ctx context.Context, subject string) (uint64, error) {
	return lastSeq(ctx, s.Events, subject)
}

// ReadEventsPage reads lifecycle events on subject (a filter with
// wildcards) after stream sequence afterSeq: at most eventsMax that keep
// passes, examining at most scanMax messages. Cursor is the last sequence
// examined; Complete when that reached the stream's end at the time of the read.
// An event whose provider or parent is not its subject's is skipped
// (EventOnItsSubject), and so is one its run's spec does not name
// (EventOfItsRun).
func (s *Store) ReadEventsPage(ctx context.Context, subject string, afterSeq protocol.Seq, eventsMax, scanMax int,
	keep func(protocol.LifecycleEvent) (bool, error)) (protocol.EventsPage, error) {
	page := protocol.EventsPage{Events: []protocol.LifecycleEvent{}, Cursor: afterSeq}
	last, err := lastSeq(ctx, s.Events, subject)
	if err != nil {
		return page, fmt.Errorf("read lifecycle events: %w", err)
	}
	if last <= uint64(afterSeq) {
		page.Complete = true
		return page, nil
	}
	scanned := 0
	err = s.scan(ctx, s.Subj.StreamEvents(), subject, uint64(afterSeq)+1, last, protocol.ReadPageBytesMax, func(m *jetstream.RawStreamMsg) (bool, error) {
		scanned++
		var ev protocol.LifecycleEvent
		if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &ev); err == nil && s.EventOnItsSubject(m.Subject, ev) {
			ok, err := s.EventOfItsRun(ctx, ev)
			if err == nil && ok {
				ok, err = keep(ev)
			}
			if err != nil {
				return false, err
			}
			if ok {
				ev.Seq = protocol.Seq(m.Sequence)
				page.Events = append(page.Events, ev)
			}
		}
		page.Cursor = protocol.Seq(m.Sequence)
		return len(page.Events) < eventsMax && scanned < scanMax, nil
	})
	if err != nil {
		return page, fmt.Errorf("read lifecycle events: %w", err)
	}
	page.Complete = uint64(page.Cursor) >= last
	return page, nil
}

// EventOnItsSubject reports whether lifecycle event ev, stored on subject,
// names the provider and parent its subject names, and is of its kind: a
// worker may publish only under its own provider's subjects
// (docs/security.md), so an event it publishes there naming another
// provider's child, or another parent than the subject's, is not read.
func (s *Store) EventOnItsSubject(subject string, ev protocol.LifecycleEvent) bool {
	provider, parent, kind, ok := s.Subj.EventsOf(subject)
	if !ok || ev.Provider != provider || ev.ParentSession != parent {
		return false
	}
	return (kind == protocol.EventKindStart && ev.Type == protocol.LifecycleStart) ||
		(kind == protocol.EventKindEnd && ev.Type == protocol.LifecycleEnd)
}

// EventOfItsRun reports whether lifecycle event ev is one of the run it
// names: that run's spec (RunSpec: created once by a coordinator, written by
// no worker) names ev's child, provider, parent and mode. A worker may
// publish events under its own provider's subjects (docs/security.md), so
// one naming a child that is not its run's (a child of another root, a
// session that never was) or a run that never was is not read. A spec that
// is gone (a run's records live while it runs and Config.RunsMaxAge
// after its settlement, events EventsMaxAge from their publication) takes its run's events with it. An
// error reading the spec is returned (the read is retried), never taken as
// a refusal.
func (s *Store) EventOfItsRun(ctx context.Context, ev protocol.LifecycleEvent) (bool, error) {
	spec, err := s.RunSpec(ctx, ev.RunID)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return spec.ChildID == ev.ID && spec.Provider == ev.Provider && spec.ParentSession == ev.ParentSession && spec.Mode == ev.Mode, nil
}

// ReadInboxPage reads the pending inbox items of session id of scope scope
// (its header's Scope) after inbox sequence afterSeq, oldest first: at most
// itemsMax and about bytesMax bytes of them (one item always). more reports
// pending items after the last one returned.
func (s *Store) ReadInboxPage(ctx context.Context, scope, id string, afterSeq protocol.Seq, itemsMax, bytesMax int) (items []protocol.InboxItem, more bool, err error) {
	items = []protocol.InboxItem{}
	str, err := s.InboxStream(ctx, scope)
	if err != nil {
		return items, false, err
	}
	subject := s.Subj.Inbox(scope, id)
	last, err := lastSeq(ctx, str, subject)
	if err != nil || last <= uint64(afterSeq) {
		return items, false, err
	}
	bytes := 0
	err = s.scan(ctx, s.Subj.StreamInbox(scope), subject, uint64(afterSeq)+1, last, bytesMax, func(m *jetstream.RawStreamMsg) (bool, error) {
		if len(items) >= itemsMax || (len(items) > 0 && bytes+len(m.Data) > bytesMax) {
			more = true
			return false, nil
		}
		var it protocol.InboxItem
		if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &it); err != nil {
			return false, fmt.Errorf("decode inbox item %s@%d: %w", id, m.Sequence, err)
		}
		it.Seq = protocol.Seq(m.Sequence)
		items = append(items, it)
		bytes += len(m.Data)
		return true, nil
	})
	if err != nil {
		return items, false, fmt.Errorf("read inbox %s: %w", id, err)
	}
	return items, more, nil
}

// RemoveInboxItems deletes the given items of the inbox of session id of
// scope scope (its header's Scope) and returns how many it deleted. A
// sequence that is gone already is skipped; one that holds another
// session's item is INVALID_ARGUMENT, and nothing after it is deleted.
func (s *Store) RemoveInboxItems(ctx context.Context, scope, id string, seqs []protocol.Seq) (int, error) {
	str, err := s.InboxStream(ctx, scope)
	if err != nil {
		return 0, err
	}
	subject := s.Subj.Inbox(scope, id)
	removed := 0
	for _, seq := range seqs {
		m, err := str.GetMsg(ctx, uint64(seq))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return removed, fmt.Errorf("read inbox item %d: %w", seq, err)
		}
		if m.Subject != subject {
			return removed, protocol.Errorf(protocol.CodeInvalidArgument, "inbox sequence %d is not an item of session %s", seq, id)
		}
		if err := str.DeleteMsg(ctx, uint64(seq)); err != nil {
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			return removed, fmt.Errorf("remove inbox item %s@%d: %w", id, seq, err)
		}
		removed++
	}
	return removed, nil
}
