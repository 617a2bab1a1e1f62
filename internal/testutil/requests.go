package testutil

import (
	"context"
	"sync"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Requests is a coordinator's requests (docs/protocol.md §5.21) as the
// asking session sees them (a requestwait.Requester), for the tests of
// the sessions that wait for answers: internal/agent's parked calls and
// budget pauses, services/acp-bridge's permission requests and budget
// pauses. A request opens pending (its record as opened, ID
// protocol.RequestID(session, callId)); reads of it return State,
// answered by By with Reason, Text and JSON, from the Polls-th read on
// (counting every read, from 1; 0 is 1); with no State it stays pending.
// Set the fields before the first call; Answer changes the answer later.
type Requests struct {
	// Credential, when set, is the only one a read is made with: a read
	// with another is UNAUTHORIZED.
	Credential string
	OpenErr    error // when set, every open fails with it
	State      string
	Reason     string
	Text       string // a question's answer
	JSON       string
	By         protocol.Answerer // zero: the user, or the timeout when State is timed-out
	Polls      int
	Deadline   int64 // the opened requests' deadline, Unix ms
	// Reading, when set, is closed at the first read.
	Reading chan struct{}
	// Hold, when set, makes a read of a request with no State in flight
	// when its context ends return only once Hold is closed (a read that
	// ignores its context, answering late): it waits for its context to
	// end, then for Hold, and returns the context's error.
	Hold chan struct{}

	mu     sync.Mutex
	reads  int
	opened []protocol.RequestOpenRequest
	recs   map[string]protocol.RequestRecord
}

// OpenRequest opens r pending (or fails with OpenErr) and keeps it.
func (q *Requests) OpenRequest(_ context.Context, r protocol.RequestOpenRequest) (protocol.RequestRecord, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.opened = append(q.opened, r)
	if q.OpenErr != nil {
		return protocol.RequestRecord{}, q.OpenErr
	}
	rec := protocol.RequestRecord{ID: protocol.RequestID(r.Self.SessionID, r.CallID), SessionID: r.Self.SessionID, Kind: r.Kind,
		CallID: r.CallID, Turn: r.Turn, Step: r.Step, Tool: r.Tool, Arguments: r.Arguments, BudgetOf: r.BudgetOf, Exhausted: r.Exhausted,
		State: protocol.RequestPending, Deadline: q.Deadline}
	if q.recs == nil {
		q.recs = map[string]protocol.RequestRecord{}
	}
	q.recs[rec.ID] = rec
	return rec, nil
}

// GetRequest reads request r.RequestID: its record as opened (only its
// ID when it was opened elsewhere, as before a restart), pending or
// answered.
func (q *Requests) GetRequest(ctx context.Context, r protocol.RequestGetRequest) (protocol.RequestRecord, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.reads == 0 && q.Reading != nil {
		close(q.Reading)
	}
	q.reads++
	if q.Credential != "" && (r.Self == nil || r.Self.Credential != q.Credential) {
		return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeUnauthorized, "not the credential of the request's session")
	}
	if q.State == "" && q.Hold != nil {
		q.mu.Unlock()
		<-ctx.Done()
		<-q.Hold
		q.mu.Lock()
		return protocol.RequestRecord{}, ctx.Err()
	}
	rec, ok := q.recs[r.RequestID]
	if !ok {
		rec = protocol.RequestRecord{ID: r.RequestID, State: protocol.RequestPending}
	}
	if q.State != "" && q.reads >= q.Polls {
		by := q.By
		if by.Kind == "" {
			by.Kind = protocol.AnswererUser
			if q.State == protocol.RequestTimedOut {
				by.Kind = protocol.AnswererTimeout
			}
		}
		rec.State = q.State
		rec.Answer = &protocol.RequestAnswer{State: q.State, Reason: q.Reason, Text: q.Text, JSON: q.JSON, By: by}
	}
	return rec, nil
}

// Answer answers every request, opened and to come, with state (by By)
// and reason from the next read on.
func (q *Requests) Answer(state, reason string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.State, q.Reason, q.Polls = state, reason, 0
}

// Reads returns how many reads were made (refused ones too).
func (q *Requests) Reads() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.reads
}

// Opened returns the requests opened (tried, with OpenErr), in order.
func (q *Requests) Opened() []protocol.RequestOpenRequest {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]protocol.RequestOpenRequest(nil), q.opened...)
}
