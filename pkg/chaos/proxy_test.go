package chaos

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

// echoServer answers every line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return l.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string, within time.Duration) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return 0, err
	}
	_ = c.SetReadDeadline(time.Now().Add(within))
	got, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	if got != line+"\n" {
		t.Fatalf("echo %q, want %q", got, line)
	}
	return time.Since(start), nil
}

func TestProxyModes(t *testing.T) {
	p, err := NewProxy("test", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)

	if _, err := roundTrip(t, c, r, "pass", 5*time.Second); err != nil {
		t.Fatalf("pass: %v", err)
	}

	p.Set(Pass, 150*time.Millisecond)
	if d, err := roundTrip(t, c, r, "delayed", 5*time.Second); err != nil || d < 300*time.Millisecond {
		t.Fatalf("delay 150ms each way: round trip %s, %v; want at least 300ms", d, err)
	}

	p.Set(Drop, 0)
	if _, err := roundTrip(t, c, r, "held", 300*time.Millisecond); err == nil {
		t.Fatal("drop: a byte got through")
	}
	p.Heal()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "held\n" {
		t.Fatalf("after the drop healed: %q, %v; want the held line delivered", got, err)
	}

	p.Set(Cut, 0)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadByte(); err == nil {
		t.Fatal("cut: the open connection was not closed")
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c2.Read(make([]byte, 1)); err == nil {
		t.Fatal("cut: a new connection was served")
	}
	c2.Close()

	p.Heal()
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if _, err := roundTrip(t, c3, bufio.NewReader(c3), "healed", 5*time.Second); err != nil {
		t.Fatalf("healed: %v", err)
	}
	// The proxy notices c2's close on its own goroutine: wait for it.
	for deadline := time.Now().Add(10 * time.Second); p.Active() != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("active connections %d, want 1", p.Active())
		}
	}
}

func TestProxyDropHoldsNewConnections(t *testing.T) {
	p, err := NewProxy("test", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Set(Drop, 0)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := roundTrip(t, c, r, "early", 300*time.Millisecond); err == nil {
		t.Fatal("a connection accepted during a drop was served")
	}
	p.Heal()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "early\n" {
		t.Fatalf("after the heal: %q, %v", got, err)
	}
}
