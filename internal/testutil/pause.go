package testutil

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Settlement selects the writes of st's run records that settle one (a
// compare-and-set or, were it ever one, a put of a settled record).
func Settlement(st *store.Store) func(store.Write) bool {
	runs := st.Subj.BucketRuns()
	return func(w store.Write) bool {
		if w.Bucket != runs || (w.Op != store.OpKVUpdate && w.Op != store.OpKVPut) {
			return false
		}
		var rec protocol.RunRecord
		return protocol.Unmarshal(protocol.Msgpack, w.Value, &rec) == nil && rec.State == protocol.RunSettled
	}
}

// Pause makes a service look paused at a chosen write (issue 15's contention
// tests): the first write that Hold selects is held, unsent, until Release,
// and from that moment the service's heartbeats (KV puts to brood_hosts)
// fail, so the other parties judge it dead and take its work over while it
// waits. Once released, the held write goes on, as a process back from a
// pause would send it; the answers of the selected writes sent after Release
// are kept for the test.
type Pause struct {
	hold      func(store.Write) bool
	stopBeats bool
	down      atomic.Bool
	held      chan struct{}
	heldOnce  sync.Once
	release   chan struct{}
	relOnce   sync.Once

	mu      sync.Mutex
	first   store.Write
	answers []error
}

// NewPause returns a Pause that holds the writes hold selects.
func NewPause(hold func(store.Write) bool) *Pause {
	return &Pause{hold: hold, stopBeats: true, held: make(chan struct{}), release: make(chan struct{})}
}

// NewHold is NewPause without the heartbeats' failure: only the selected
// writes wait (two parties brought to the same compare-and-set at once).
func NewHold(hold func(store.Write) bool) *Pause {
	return &Pause{hold: hold, held: make(chan struct{}), release: make(chan struct{})}
}

// ErrPaused is the answer of a heartbeat sent while the service is paused.
var ErrPaused = errors.New("testutil: the service is paused")

// Faults is the seam to give st.WithFaults.
func (p *Pause) Faults(st *store.Store) store.Faults {
	hosts := st.Subj.BucketHosts()
	return store.Faults{
		Before: func(ctx context.Context, w store.Write) error {
			if w.Op == store.OpKVPut && w.Bucket == hosts && p.down.Load() {
				return ErrPaused
			}
			if !p.hold(w) {
				return nil
			}
			select {
			case <-p.release:
				return nil
			default:
			}
			if p.stopBeats {
				p.down.Store(true)
			}
			p.heldOnce.Do(func() {
				p.mu.Lock()
				p.first = w
				p.mu.Unlock()
				close(p.held)
			})
			<-p.release // a paused process does not notice its deadlines pass
			return nil
		},
		After: func(ctx context.Context, w store.Write, err error) error {
			if p.hold(w) {
				select {
				case <-p.release:
					p.mu.Lock()
					p.answers = append(p.answers, err)
					p.mu.Unlock()
				default:
				}
			}
			return err
		},
	}
}

// Held is closed once a selected write is held.
func (p *Pause) Held() <-chan struct{} { return p.held }

// WaitHeld waits up to a minute for a selected write to be held (what names
// it in the failure).
func (p *Pause) WaitHeld(t testing.TB, what string) {
	t.Helper()
	select {
	case <-p.held:
	case <-time.After(time.Minute):
		t.Fatalf("%s was never reached", what)
	}
}

// HeldWrite is the first write that was held (valid once Held is closed).
func (p *Pause) HeldWrite() store.Write {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.first
}

// Release lets the held writes go on; the heartbeats stay down (the service
// is judged dead until it stops).
func (p *Pause) Release() { p.relOnce.Do(func() { close(p.release) }) }

// Answers are JetStream's answers to the selected writes sent after Release.
func (p *Pause) Answers() []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]error(nil), p.answers...)
}
