// Package gopool runs tasks on goroutines that are reused: a goroutine that
// finished a task waits up to IdleMax for the next one before it exits. A
// fresh goroutine starts with a small stack that grows, and is copied,
// several times while it encodes a record by reflection and writes to
// JetStream; a reused one has grown already. In issue 12's CPU profile of
// the one-shot throughput loop, the stack growth of the goroutines started
// per run (a request's handler, the coordinator's parallel writes, a run's
// spec write, a worker's lease write) was 4-6 % of the coordinator's and
// the worker's CPU.
//
// A Pool belongs to one server (internal/rpc.Server): its context ends the
// idle goroutines, and Wait waits for every goroutine it started. A request
// handler's context carries its server's Pool (WithPool), so the code a
// handler calls starts its helpers with Go(ctx, f) on that Pool, and a
// context without one (a test, a background loop) gets a plain goroutine.
package gopool

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// IdleMax is how long a goroutine of a Pool waits for its next task before
// it exits.
const IdleMax = 10 * time.Second

// Pool runs tasks on reused goroutines (see the package comment).
type Pool struct {
	ctx context.Context
	// jobs hands a task to an idle goroutine (unbuffered: a send succeeds
	// only when one waits).
	jobs chan func()
	wg   sync.WaitGroup
	// mu guards waiting: once Wait began, a task runs on a goroutine of its
	// own, untracked (a goroutine detached from a request, holding its
	// context's values, may still start one; adding to wg then would race
	// with Wait).
	mu      sync.Mutex
	waiting bool
	// started counts the goroutines p started.
	started atomic.Int64
}

// New returns a Pool whose idle goroutines exit once ctx is done. A task
// given after that still runs, on a goroutine of its own.
func New(ctx context.Context) *Pool {
	return &Pool{ctx: ctx, jobs: make(chan func())}
}

// Go runs f on an idle goroutine of p, or on a new one. It does not wait
// for f.
func (p *Pool) Go(f func()) {
	select {
	case p.jobs <- f:
		return
	default:
	}
	p.mu.Lock()
	if p.waiting {
		p.mu.Unlock()
		go f()
		return
	}
	p.wg.Add(1)
	p.mu.Unlock()
	p.started.Add(1)
	go p.loop(f)
}

// loop runs f, then each task handed to it, until it was idle for IdleMax
// or p's context is done.
func (p *Pool) loop(f func()) {
	defer p.wg.Done()
	idle := time.NewTimer(IdleMax)
	defer idle.Stop()
	for {
		f()
		idle.Reset(IdleMax)
		select {
		case f = <-p.jobs:
		case <-idle.C:
			return
		case <-p.ctx.Done():
			return
		}
	}
}

// Wait waits until every goroutine p started returned: each task given to
// p returned, and p's context is done (or they sat idle for IdleMax). A
// task given from then on runs on a goroutine of its own, which Wait does
// not wait for.
func (p *Pool) Wait() {
	p.mu.Lock()
	p.waiting = true
	p.mu.Unlock()
	p.wg.Wait()
}

type poolKey struct{}

// WithPool returns ctx carrying p, for Go.
func WithPool(ctx context.Context, p *Pool) context.Context {
	return context.WithValue(ctx, poolKey{}, p)
}

// Go runs f on the Pool ctx carries (WithPool), else on a goroutine of its
// own. The caller waits for f (or hands it work bounded in time): a Pool's
// owner waits for its tasks only when it stops.
func Go(ctx context.Context, f func()) {
	if p, ok := ctx.Value(poolKey{}).(*Pool); ok {
		p.Go(f)
		return
	}
	go f()
}
