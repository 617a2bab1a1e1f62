package deploy

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/routetls"
)

// A route joins only with the deployment's certificate (issue 29, item 2;
// docs/security.md, "No usable shared secret ships"): the node configs
// shipped a route password that worked as shipped, so any process that
// reached a route port joined the cluster as a route and read every
// message, replies included. Now the routes authenticate by mutual TLS with
// a CA each deployment generates: a would-be route with the old password,
// with no certificate, or with a certificate of another CA is refused and
// reads nothing, while a node holding the deployment's certificate joins
// and reads what the cluster carries (the attack would work if the door
// were open).

// spyAccount is the account a would-be route reads: the cluster's.
const spyAccount = "BROOD"

// routeSpy is a nats-server that tries to join the cluster as a route, with
// a user in the cluster's account subscribed to every subject.
type routeSpy struct {
	name string
	srv  *server.Server
	got  chan string
	log  *lineLog
}

// lineLog is a nats-server logger keeping its errors and warnings.
type lineLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLog) add(format string, v ...any) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf(format, v...))
	l.mu.Unlock()
}

func (l *lineLog) has(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.lines {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func (l *lineLog) Noticef(string, ...any)    {}
func (l *lineLog) Warnf(f string, v ...any)  { l.add(f, v...) }
func (l *lineLog) Fatalf(f string, v ...any) { l.add(f, v...) }
func (l *lineLog) Errorf(f string, v ...any) { l.add(f, v...) }
func (l *lineLog) Debugf(f string, v ...any) { l.add(f, v...) }
func (l *lineLog) Tracef(string, ...any)     {}

func startRouteSpy(t *testing.T, name string, route *url.URL, tlsConf *tls.Config) *routeSpy {
	t.Helper()
	acc := server.NewAccount(spyAccount)
	o := &server.Options{
		ServerName: name, Host: "127.0.0.1", Port: -1, NoSigs: true, Debug: true,
		Accounts: []*server.Account{acc},
		Users:    []*server.User{{Username: "spy", Password: "spy", Account: acc}},
		Cluster:  server.ClusterOpts{Name: "brood", Host: "127.0.0.1", Port: -1, TLSConfig: tlsConf, TLSTimeout: 2},
		Routes:   []*url.URL{route},
	}
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	log := &lineLog{}
	s.SetLoggerV2(log, true, false, false)
	go s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatalf("%s not accepting clients", name)
	}
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("spy", "spy"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	sp := &routeSpy{name: name, srv: s, got: make(chan string, 1024), log: log}
	if _, err := nc.Subscribe(">", func(m *nats.Msg) {
		select {
		case sp.got <- m.Subject:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return sp
}

// spyTLS is a route TLS config presenting certFile/keyFile (none when
// empty) and trusting any server: what a process that wants in would use.
func spyTLS(t *testing.T, certPEM, keyPEM []byte) *tls.Config {
	t.Helper()
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true} //nolint:gosec // the attacker's side
	if certPEM != nil {
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c
}

// deploymentTLS is a route TLS config as a node of the deployment has it:
// a certificate of the deployment's CA, verifying its peers against it.
func deploymentTLS(t *testing.T, node string) *tls.Config {
	t.Helper()
	dir := routeTLSDir(t, node)
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, routetls.CertFile(node)), filepath.Join(dir, routetls.KeyFile(node)))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, routetls.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("no CA certificate")
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert},
		RootCAs: pool, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
}

func TestForgeryRouteJoin(t *testing.T) {
	setPasswords(t)
	servers := startServers(t, clusterOptions(t)...)
	waitFor(t, 20*time.Second, "the three nodes routed to each other", func() bool {
		for _, s := range servers {
			if s.NumRoutes() < len(servers)-1 {
				return false
			}
		}
		return true
	})
	node1 := servers[0]
	addr := node1.ClusterAddr()
	if addr == nil {
		t.Fatal("node 1 has no cluster listener")
	}
	routeURL := func(userinfo string) *url.URL {
		u, err := url.Parse("nats-route://" + userinfo + net.JoinHostPort("127.0.0.1", strconv.Itoa(addr.Port)))
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	otherCA, err := routetls.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	otherCert, otherKey, err := otherCA.Issue("brood-nats-1", routeTLSHosts)
	if err != nil {
		t.Fatal(err)
	}
	spies := []*routeSpy{
		startRouteSpy(t, "spy-shipped-password", routeURL("brood-route:change-me-route-secret@"), nil),
		startRouteSpy(t, "spy-no-certificate", routeURL(""), spyTLS(t, nil, nil)),
		startRouteSpy(t, "spy-another-ca", routeURL(""), spyTLS(t, otherCert, otherKey)),
	}
	// Each one has tried: a solicited route that closes is tried again.
	for _, sp := range spies {
		waitFor(t, 10*time.Second, sp.name+" refused (its route closed)", func() bool {
			return sp.log.has("Attempting reconnect for solicited route")
		})
	}
	// A node holding the deployment's certificate joins and reads.
	member := startRouteSpy(t, "member", routeURL(""), deploymentTLS(t, "brood-nats-member"))

	pub := connectAs(t, node1.ClientURL(), "coordinator", nil)
	var mu sync.Mutex
	n := 0
	waitFor(t, 20*time.Second, "the member reads what the cluster carries", func() bool {
		mu.Lock()
		n++
		subj := fmt.Sprintf("brood.v1.wake.spawn.PROBE%d", n)
		mu.Unlock()
		if err := pub.Publish(subj, nil); err != nil {
			t.Fatal(err)
		}
		_ = pub.Flush()
		select {
		case <-member.got:
			return true
		case <-time.After(100 * time.Millisecond):
			return false
		}
	})
	routed := map[string]bool{}
	rz, err := node1.Routez(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rz.Routes {
		routed[r.RemoteName] = true
	}
	if !routed["member"] {
		t.Fatalf("node 1's routes %v lack the member", routed)
	}
	for _, sp := range spies {
		t.Run(sp.name, func(t *testing.T) {
			if routed[sp.name] || sp.srv.NumRoutes() != 0 {
				t.Fatalf("%s joined the cluster: node 1 routes to %v, it has %d routes; its log:\n%s", sp.name, routed, sp.srv.NumRoutes(), sp.log)
			}
			select {
			case subj := <-sp.got:
				t.Fatalf("%s read %s", sp.name, subj)
			default:
			}
		})
	}
	// The wrong doors stayed shut while the right one opened; and the route
	// URLs of the shipped configs carry no password to try.
	for _, o := range clusterOptions(t) {
		for _, r := range o.Routes {
			if _, ok := r.User.Password(); ok || strings.Contains(r.String(), "@") {
				t.Errorf("%s: route %s carries credentials", o.ServerName, r.Redacted())
			}
		}
	}
}
