package chaos

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// LinkMode is what a Proxy does to the bytes of its connections.
type LinkMode int

const (
	// Pass forwards bytes, after the link's delay if one is set.
	Pass LinkMode = iota
	// Drop holds every byte and every close in both directions until the
	// link passes again, the way a network that drops packets stalls TCP
	// (the kernel retransmits, nothing arrives): neither end learns anything
	// except from its own timeouts. New connections are accepted and held
	// the same way.
	Drop
	// Cut resets the link: open connections are closed at both ends and new
	// ones are closed as soon as they are accepted, as a peer whose process
	// died or a firewall that rejects.
	Cut
)

func (m LinkMode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Drop:
		return "drop"
	case Cut:
		return "cut"
	}
	return fmt.Sprintf("LinkMode(%d)", int(m))
}

// proxyQueueBytesMax bounds the bytes a Proxy holds per direction of one
// connection (while a link drops or delays); past it the proxy stops reading,
// so the sender's TCP window fills as it would on a real network.
const proxyQueueBytesMax = 4 << 20

// proxyDialTimeout bounds the proxy's dial of its target.
const proxyDialTimeout = 2 * time.Second

// Proxy is a TCP proxy on a loopback port that forwards every connection to
// one target address (a nats-server's client or route port). The harness
// puts one on every route (one per direction of each pair of nodes) and on
// every client connection (one per process and node), so a fault can drop,
// delay or cut exactly one link. A Proxy keeps its port for its whole life,
// so a restarted target or process finds it again. Safe for concurrent use.
type Proxy struct {
	name   string
	target string
	ln     net.Listener

	mu     sync.Mutex
	cond   *sync.Cond // broadcast on every change of mode, delay or connections
	mode   LinkMode
	delay  time.Duration
	conns  map[*proxyConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewProxy listens on 127.0.0.1 (a free port) and forwards to target.
func NewProxy(name, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy %s: %w", name, err)
	}
	p := &Proxy{name: name, target: target, ln: ln, conns: map[*proxyConn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Name names the link (e.g. "n1>n2" or "coordinator-1>n3").
func (p *Proxy) Name() string { return p.name }

// Addr is the proxy's host:port; connect here instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Set changes the link's mode; Pass with a delay adds latency to every byte
// in both directions (one way: delay, round trip: twice that).
func (p *Proxy) Set(mode LinkMode, delay time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode, p.delay = mode, delay
	if mode == Cut {
		for c := range p.conns {
			c.closeLocked()
		}
	}
	p.cond.Broadcast()
}

// Heal is Set(Pass, 0).
func (p *Proxy) Heal() { p.Set(Pass, 0) }

// Mode returns the link's mode and delay.
func (p *Proxy) Mode() (LinkMode, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode, p.delay
}

// Active is the number of open connections through the proxy.
func (p *Proxy) Active() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops listening and closes every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	_ = p.ln.Close()
	for c := range p.conns {
		c.closeLocked()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed || p.mode == Cut {
			p.mu.Unlock()
			_ = in.Close()
			continue
		}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(in)
	}
}

// serve dials the target and relays. While the link drops, the dial waits
// (a SYN that gets no answer), up to the caller's own connect timeout.
func (p *Proxy) serve(in net.Conn) {
	defer p.wg.Done()
	p.mu.Lock()
	for p.mode == Drop && !p.closed {
		p.cond.Wait()
	}
	cut := p.closed || p.mode == Cut
	p.mu.Unlock()
	if cut {
		_ = in.Close()
		return
	}
	out, err := net.DialTimeout("tcp", p.target, proxyDialTimeout)
	if err != nil {
		_ = in.Close()
		return
	}
	c := &proxyConn{p: p, a: in, b: out}
	p.mu.Lock()
	if p.closed || p.mode == Cut {
		p.mu.Unlock()
		_ = in.Close()
		_ = out.Close()
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); c.relay(in, out) }()
	go func() { defer wg.Done(); c.relay(out, in) }()
	wg.Wait()
	p.mu.Lock()
	c.closeLocked()
	delete(p.conns, c)
	p.cond.Broadcast()
	p.mu.Unlock()
}

// proxyConn is one relayed connection: a is the accepted side, b the target.
type proxyConn struct {
	p      *Proxy
	a, b   net.Conn
	closed bool
}

// closeLocked closes both sides; p.mu is held.
func (c *proxyConn) closeLocked() {
	if !c.closed {
		c.closed = true
		_ = c.a.Close()
		_ = c.b.Close()
	}
}

// chunk is bytes read at a time, or the end of the stream (data nil).
type chunk struct {
	at   time.Time
	data []byte
}

// relay copies from src to dst through a bounded queue: a reader that stops
// reading when the queue is full, and a writer that releases each chunk once
// the link passes and its delay has elapsed (so latency adds to every byte
// without cutting throughput, and order is kept).
func (c *proxyConn) relay(src, dst net.Conn) {
	p := c.p
	var (
		mu     sync.Mutex
		queue  []chunk
		queued int
		done   bool // reader finished (EOF or error), its end is queued
	)
	space := sync.NewCond(&mu)
	wake := func() { p.mu.Lock(); p.cond.Broadcast(); p.mu.Unlock() }
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			mu.Lock()
			if n > 0 {
				for queued > proxyQueueBytesMax && !done {
					space.Wait()
				}
				queue = append(queue, chunk{at: time.Now(), data: append([]byte(nil), buf[:n]...)})
				queued += n
			}
			if err != nil {
				queue = append(queue, chunk{at: time.Now()})
				done = true
			}
			mu.Unlock()
			wake()
			if err != nil {
				return
			}
		}
	}()
	for {
		// Wait for a chunk the link lets through now.
		p.mu.Lock()
		var next chunk
		for {
			if c.closed {
				p.mu.Unlock()
				mu.Lock()
				done = true
				space.Broadcast()
				mu.Unlock()
				return
			}
			mu.Lock()
			have := len(queue) > 0
			if have {
				next = queue[0]
			}
			mu.Unlock()
			if have && p.mode == Pass {
				if wait := time.Until(next.at.Add(p.delay)); wait > 0 {
					p.mu.Unlock()
					time.Sleep(min(wait, 50*time.Millisecond))
					p.mu.Lock()
					continue
				}
				break
			}
			p.cond.Wait()
		}
		p.mu.Unlock()
		mu.Lock()
		queue = queue[1:]
		queued -= len(next.data)
		space.Broadcast()
		mu.Unlock()
		if next.data == nil {
			// The source ended: end the destination the same way.
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			} else {
				_ = dst.Close()
			}
			return
		}
		if _, err := dst.Write(next.data); err != nil {
			_ = src.Close()
			mu.Lock()
			done = true
			space.Broadcast()
			mu.Unlock()
			return
		}
	}
}
