package requestwait

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// script answers the n-th read (from 1) with reads[n-1], and the last
// one for every later read.
type script struct {
	reads []func() (protocol.RequestRecord, error)
	n     int
	opens int
}

func (s *script) OpenRequest(context.Context, protocol.RequestOpenRequest) (protocol.RequestRecord, error) {
	s.opens++
	return protocol.RequestRecord{}, errors.New("not used")
}

func (s *script) GetRequest(_ context.Context, r protocol.RequestGetRequest) (protocol.RequestRecord, error) {
	s.n++
	if r.Self == nil || r.Self.SessionID != "S1" || r.Self.Credential != "cred" || r.RequestID != "r1" {
		return protocol.RequestRecord{}, errors.New("read as the wrong session or of the wrong request")
	}
	return s.reads[min(s.n, len(s.reads))-1]()
}

func state(st string) func() (protocol.RequestRecord, error) {
	return func() (protocol.RequestRecord, error) { return protocol.RequestRecord{ID: "r1", State: st}, nil }
}

func fail(err error) func() (protocol.RequestRecord, error) {
	return func() (protocol.RequestRecord, error) { return protocol.RequestRecord{}, err }
}

// TestAwait: a wait ends at the first read that is no longer pending, goes
// on through a failed read, stops at a read that says the caller is not
// the session's agent or the request is gone, and at its context's end;
// the reads back off from the first wait.
func TestAwait(t *testing.T) {
	unauthorized := protocol.Errorf(protocol.CodeUnauthorized, "the credential is not that of the agent")
	gone := protocol.Errorf(protocol.CodeNotFound, "request r1 is not known")
	tests := []struct {
		name    string
		reads   []func() (protocol.RequestRecord, error)
		first   time.Duration
		timeout time.Duration
		state   string
		err     error // errors.Is / code
		n       int   // reads made
	}{
		{"approved at the third read", []func() (protocol.RequestRecord, error){state(protocol.RequestPending), state(protocol.RequestPending), state(protocol.RequestApproved)},
			PollInterval, 10 * time.Second, protocol.RequestApproved, nil, 3},
		{"a first read at once, after a restart", []func() (protocol.RequestRecord, error){state(protocol.RequestPending), state(protocol.RequestAnswered)},
			0, 10 * time.Second, protocol.RequestAnswered, nil, 2},
		{"a failed read is tried again", []func() (protocol.RequestRecord, error){fail(errors.New("UNAVAILABLE: no coordinator")), state(protocol.RequestDenied)},
			PollInterval, 10 * time.Second, protocol.RequestDenied, nil, 2},
		{"no longer the session's agent", []func() (protocol.RequestRecord, error){fail(unauthorized)},
			PollInterval, 10 * time.Second, protocol.RequestPending, unauthorized, 1},
		{"the request is gone", []func() (protocol.RequestRecord, error){fail(gone)},
			PollInterval, 10 * time.Second, protocol.RequestPending, gone, 1},
		{"the context ends", []func() (protocol.RequestRecord, error){state(protocol.RequestPending)},
			PollInterval, 900 * time.Millisecond, protocol.RequestPending, context.DeadlineExceeded, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &script{reads: tt.reads}
			ctx, cancel := context.WithTimeout(context.Background(), tt.timeout)
			defer cancel()
			start := time.Now()
			rec, err := Await(ctx, s, protocol.ParentRef{SessionID: "S1", Credential: "cred"},
				protocol.RequestRecord{ID: "r1", State: protocol.RequestPending}, tt.first, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if rec.State != tt.state || !errors.Is(err, tt.err) && protocol.CodeOf(err) != protocol.CodeOf(tt.err) || (err == nil) != (tt.err == nil) {
				t.Fatalf("Await = %s, %v; want %s, %v", rec.State, err, tt.state, tt.err)
			}
			if s.n != tt.n {
				t.Fatalf("%d reads, want %d", s.n, tt.n)
			}
			// n reads back off: first, then 250 ms, 500 ms, 1 s, … before each.
			if tt.err == nil {
				least := time.Duration(0)
				for i, w := 0, tt.first; i < tt.n; i, w = i+1, min(max(2*w, PollInterval), PollIntervalMax) {
					least += w
				}
				if took := time.Since(start); took < least {
					t.Fatalf("%d reads took %s, less than the backoff's %s", tt.n, took, least)
				}
			}
		})
	}
}

// TestAwaitAnsweredReadsNothing: a record that is not pending is returned
// as it is, without a read.
func TestAwaitAnsweredReadsNothing(t *testing.T) {
	s := &script{}
	rec, err := Await(context.Background(), s, protocol.ParentRef{SessionID: "S1", Credential: "cred"},
		protocol.RequestRecord{ID: "r1", State: protocol.RequestTimedOut}, PollInterval, slog.Default())
	if err != nil || rec.State != protocol.RequestTimedOut || s.n != 0 {
		t.Fatalf("Await = %+v, %v after %d reads", rec, err, s.n)
	}
}

// deaf is a requests client whose read ignores its context: it blocks
// until release is closed, then answers approved.
type deaf struct {
	reading  chan struct{} // closed when the read starts
	release  chan struct{}
	returned chan struct{} // closed when the read returns
}

func (d *deaf) OpenRequest(context.Context, protocol.RequestOpenRequest) (protocol.RequestRecord, error) {
	return protocol.RequestRecord{}, errors.New("not used")
}

func (d *deaf) GetRequest(_ context.Context, r protocol.RequestGetRequest) (protocol.RequestRecord, error) {
	defer close(d.returned)
	close(d.reading)
	<-d.release
	return protocol.RequestRecord{ID: r.RequestID, State: protocol.RequestApproved}, nil
}

// TestAwaitAbandonsAReadAtItsContextsEnd: a wait whose context ends while
// a read that ignores its context is in flight returns at once with the
// context's error and the request as last read (pending), not when the
// read returns; the read's late answer is dropped, and its goroutine ends
// when the read returns (TestMain's goleak).
func TestAwaitAbandonsAReadAtItsContextsEnd(t *testing.T) {
	d := &deaf{reading: make(chan struct{}), release: make(chan struct{}), returned: make(chan struct{})}
	defer func() { <-d.returned }()
	defer close(d.release)
	ctx, cancel := context.WithCancel(context.Background())
	type result struct {
		rec protocol.RequestRecord
		err error
	}
	done := make(chan result, 1)
	go func() {
		rec, err := Await(ctx, d, protocol.ParentRef{SessionID: "S1", Credential: "cred"},
			protocol.RequestRecord{ID: "r1", State: protocol.RequestPending}, 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
		done <- result{rec, err}
	}()
	<-d.reading
	cancel()
	select {
	case r := <-done:
		if !errors.Is(r.err, context.Canceled) || r.rec.State != protocol.RequestPending {
			t.Fatalf("Await = %s, %v; want pending, %v", r.rec.State, r.err, context.Canceled)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Await waited for a read that ignores its context")
	}
}
