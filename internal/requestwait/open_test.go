package requestwait

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// lossy answers its calls from a script of errors (nil: the call
// succeeds) and records, per call, how far its context's deadline was.
type lossy struct {
	mu    sync.Mutex
	errs  []error
	calls []time.Duration
}

func (l *lossy) next(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	d, ok := ctx.Deadline()
	if !ok {
		d = time.Now().Add(time.Hour)
	}
	l.calls = append(l.calls, time.Until(d))
	if len(l.errs) == 0 {
		return nil
	}
	err := l.errs[0]
	l.errs = l.errs[1:]
	return err
}

func (l *lossy) OpenRequest(ctx context.Context, r protocol.RequestOpenRequest) (protocol.RequestRecord, error) {
	if err := l.next(ctx); err != nil {
		return protocol.RequestRecord{}, err
	}
	return protocol.RequestRecord{ID: "R", CallID: r.CallID, State: protocol.RequestPending}, nil
}

func (l *lossy) GetRequest(ctx context.Context, r protocol.RequestGetRequest) (protocol.RequestRecord, error) {
	if err := l.next(ctx); err != nil {
		return protocol.RequestRecord{}, err
	}
	return protocol.RequestRecord{ID: r.RequestID, State: protocol.RequestApproved}, nil
}

// TestCallsAreBoundedAndMadeAgain: an open or a read made under a turn's
// long deadline is bounded by CallTimeout each (before, by the turn's
// deadline: a call whose answer a cut link lost held a paused turn, and a
// dispose that could not reach its host, for up to 10 minutes; chaos-site
// seed 1, c1-2-23), an open the coordinators do not answer is made again,
// and a refusal is not.
func TestCallsAreBoundedAndMadeAgain(t *testing.T) {
	unavailable := protocol.Errorf(protocol.CodeUnavailable, "no reply in time")
	for _, tc := range []struct {
		name      string
		errs      []error
		wantCalls int
		wantCode  protocol.Code
	}{
		{name: "answered at once", wantCalls: 1},
		{name: "no answer twice, then opened", errs: []error{unavailable, context.DeadlineExceeded}, wantCalls: 3},
		{name: "refused", errs: []error{protocol.Errorf(protocol.CodeUnauthorized, "not this session's agent")}, wantCalls: 1, wantCode: protocol.CodeUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a turn's deadline
			defer cancel()
			l := &lossy{errs: tc.errs}
			rec, err := Open(ctx, l, protocol.RequestOpenRequest{CallID: "c1"})
			if protocol.CodeOf(err) != tc.wantCode || (tc.wantCode == "" && (err != nil || rec.ID != "R")) {
				t.Fatalf("Open = %+v, %v; want code %q", rec, err, tc.wantCode)
			}
			if len(l.calls) != tc.wantCalls {
				t.Fatalf("%d opens made, want %d", len(l.calls), tc.wantCalls)
			}
			for i, left := range l.calls {
				if left > CallTimeout {
					t.Fatalf("open %d had %v to its deadline; want at most CallTimeout (%v)", i, left, CallTimeout)
				}
			}
		})
	}
	t.Run("a read", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		l := &lossy{errs: []error{unavailable}}
		rec, err := Await(ctx, l, protocol.ParentRef{SessionID: "S"}, protocol.RequestRecord{ID: "R", State: protocol.RequestPending}, 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil || rec.State != protocol.RequestApproved || len(l.calls) != 2 {
			t.Fatalf("Await = %+v, %v after %d reads; want approved on the second read", rec, err, len(l.calls))
		}
		for i, left := range l.calls {
			if left > CallTimeout {
				t.Fatalf("read %d had %v to its deadline; want at most CallTimeout (%v)", i, left, CallTimeout)
			}
		}
	})
}
