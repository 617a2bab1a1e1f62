// Package a2agateway is `brood a2a-gateway`: Brood's providers as
// Agent2Agent (A2A) agents, served with the official A2A Go SDK's JSON-RPC
// and HTTP+JSON handlers over the coordinator's client API (pkg/client). The
// mapping (a context is a continuable child, a task is one message's turn,
// cancel is a dispose of the child's tree, ...) is docs/a2a.md; who may do
// what is docs/security.md, "The A2A gateway".
//
// The gateway is stateless: every answer is rebuilt from Brood (the child's
// session log, its header, the lifecycle events), so any number of gateways
// serve behind a load balancer and a stream re-subscribed after a restart
// resumes where the log is.
package a2agateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Limits of the gateway, each with its unit.
const (
	// RequestBytesMax bounds an HTTP request body (a message is at most
	// protocol's 256 KiB of text; the rest is JSON framing).
	RequestBytesMax = 512 << 10
	// MessageBytesMax bounds a message's text, checked before anything is
	// opened or started: the coordinator's default prompt bound (256 KiB,
	// docs/protocol.md §5.8), which it checks again.
	MessageBytesMax = 256 << 10
	// grantRenewBefore: a cached user grant is re-minted this long before
	// it expires (grants last 24 h, docs/protocol.md §5.15).
	grantRenewBefore = time.Hour
	// logWaitMs is how long one live-tail read of a session log waits for
	// the next event (docs/protocol.md §5.18, waitMs).
	logWaitMs = 10_000
	// logEventsPerPage is what one log read asks for (the maximum).
	logEventsPerPage = 1024
	// listContextsMax bounds the contexts one ListTasks reads.
	listContextsMax = 100
	// listPageSizeDefault and listPageSizeMax bound ListTasks pages.
	listPageSizeDefault = 50
	listPageSizeMax     = 100
	// shutdownTimeout bounds the drain of open HTTP requests at stop.
	shutdownTimeout = 10 * time.Second
	// readHeaderTimeout bounds a request's headers (slowloris).
	readHeaderTimeout = 10 * time.Second
)

// DialFunc opens a NATS connection that acts as Brood user `user` (its
// password from the callers file, "" where NATS has no users), with the inbox
// prefix _INBOX.<user> (docs/security.md, "Identity").
type DialFunc func(user, password string) (*nats.Conn, error)

// Config configures a Gateway. Zero values take the defaults.
type Config struct {
	// Listen is the HTTP address, default "127.0.0.1:8420" (":0" picks a
	// port: Addr tells which).
	Listen string
	// PublicURL is the base URL callers reach the gateway at, written into
	// the Agent Cards; default http://<the listening address>.
	PublicURL string
	// Callers are the bearer tokens the gateway admits and the Brood user
	// each acts as (LoadCallers). Required.
	Callers []Caller
	// Dial opens a connection as a caller's user. Required.
	Dial DialFunc
	// Cards is the client the Agent Cards are built with (providers.list):
	// the gateway's own NATS user, `a2a-gateway` in deploy/, with the
	// `client` role's permissions and nothing more. Required.
	Cards *client.Client
	// Prefix is the deployment's subject prefix, default "brood".
	Prefix string
	// Workspace is the absolute directory the roots the gateway opens for
	// new contexts name as their cwd (children work there); default "/".
	Workspace string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Gateway serves A2A over HTTP. Run serves until its context ends.
type Gateway struct {
	cfg  Config
	log  *slog.Logger
	http *http.Server
	ln   net.Listener

	ready chan struct{}

	mu    sync.Mutex
	users map[string]*userConn
}

// userConn is one Brood user's connection and its cached grant: both are
// rebuilt on demand (a restart loses nothing that Brood does not hold).
type userConn struct {
	nc      *nats.Conn
	cl      *client.Client
	grant   string
	expires time.Time
}

// New checks cfg and returns a gateway; it listens on Run.
func New(cfg Config) (*Gateway, error) {
	if err := CheckCallers(cfg.Callers); err != nil {
		return nil, err
	}
	if cfg.Dial == nil || cfg.Cards == nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "a2a-gateway: Dial and Cards are required")
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:8420"
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "brood"
	}
	if _, err := protocol.NewSubjects(cfg.Prefix); err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "a2a-gateway: %v", err)
	}
	if cfg.Workspace == "" {
		cfg.Workspace = "/"
	}
	if !strings.HasPrefix(cfg.Workspace, "/") {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "a2a-gateway: workspace %q must be an absolute path", cfg.Workspace)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	g := &Gateway{cfg: cfg, log: cfg.Logger, ready: make(chan struct{}), users: map[string]*userConn{}}
	return g, nil
}

// Ready is closed once the gateway listens.
func (g *Gateway) Ready() <-chan struct{} { return g.ready }

// Addr is the listening address (after Ready).
func (g *Gateway) Addr() string { return g.ln.Addr().String() }

// BaseURL is the URL the cards advertise (after Ready).
func (g *Gateway) BaseURL() string {
	if g.cfg.PublicURL != "" {
		return strings.TrimRight(g.cfg.PublicURL, "/")
	}
	return "http://" + g.Addr()
}

// AgentURL is the base URL of provider's agent: its card is at
// AgentURL + "/.well-known/agent-card.json".
func (g *Gateway) AgentURL(provider string) string {
	return g.BaseURL() + "/agents/" + provider
}

// Run listens and serves until ctx ends, then drains open requests (up to
// shutdownTimeout) and closes the users' connections. A drain returns nil.
func (g *Gateway) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", g.cfg.Listen)
	if err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "a2a-gateway: listen on %s: %v", g.cfg.Listen, err)
	}
	g.ln = ln
	g.http = &http.Server{Handler: g.routes(), ReadHeaderTimeout: readHeaderTimeout,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	close(g.ready)
	g.log.Info("a2a gateway serving", "addr", ln.Addr().String(), "url", g.BaseURL())
	errc := make(chan error, 1)
	go func() { errc <- g.http.Serve(ln) }()
	select {
	case err := <-errc:
		g.closeUsers()
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err = g.http.Shutdown(sctx)
	if err != nil {
		_ = g.http.Close()
	}
	<-errc
	g.closeUsers()
	g.log.Info("a2a gateway stopped")
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

func (g *Gateway) closeUsers() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for u, c := range g.users {
		c.cl.Close()
		c.nc.Close()
		delete(g.users, u)
	}
}

// routes: per provider p, under /agents/<p>: the card
// (/.well-known/agent-card.json, public), the JSON-RPC binding (/jsonrpc)
// and the HTTP+JSON binding (/rest/...), both behind the bearer check.
func (g *Gateway) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /agents/{provider}/.well-known/agent-card.json", g.serveCard)
	mux.HandleFunc("/agents/{provider}/jsonrpc", g.authed(func(w http.ResponseWriter, r *http.Request, h *handler) {
		a2asrv.NewJSONRPCHandler(h).ServeHTTP(w, r)
	}))
	mux.HandleFunc("/agents/{provider}/rest/", g.authed(func(w http.ResponseWriter, r *http.Request, h *handler) {
		http.StripPrefix("/agents/"+h.provider+"/rest", a2asrv.NewRESTHandler(h)).ServeHTTP(w, r)
	}))
	return mux
}

// authed admits a request with a known bearer token (401 otherwise, before
// anything else is read), bounds its body (RequestBytesMax) and hands it to
// the provider's handler acting as the caller's user.
func (g *Gateway) authed(next func(http.ResponseWriter, *http.Request, *handler)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		caller, err := authenticate(g.cfg.Callers, r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="brood-a2a"`)
			http.Error(w, "UNAUTHENTICATED: "+err.Error(), http.StatusUnauthorized)
			return
		}
		provider := r.PathValue("provider")
		if !protocol.ValidID(provider) {
			http.Error(w, "NO_PROVIDER: not a provider name", http.StatusNotFound)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, RequestBytesMax)
		next(w, r, &handler{g: g, provider: provider, caller: caller})
	}
}

// user returns the caller's user connection, dialling it on first use.
func (g *Gateway) user(c Caller) (*userConn, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if u, ok := g.users[c.User]; ok && !u.nc.IsClosed() {
		return u, nil
	}
	nc, err := g.cfg.Dial(c.User, c.NATSPassword)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeUnavailable, "connect as %s: %v", c.User, err)
	}
	cl, err := client.New(nc, client.Options{Prefix: g.cfg.Prefix, User: c.User})
	if err != nil {
		nc.Close()
		return nil, err
	}
	u := &userConn{nc: nc, cl: cl}
	g.users[c.User] = u
	return u, nil
}

// grant is the caller's user grant (authority.user on the user's own
// subject: it acts only on the trees of the roots that user opened), minted
// once and re-minted before it expires.
func (g *Gateway) grant(ctx context.Context, u *userConn) (protocol.Authority, error) {
	g.mu.Lock()
	if u.grant != "" && time.Until(u.expires) > grantRenewBefore {
		a := protocol.Authority{Grant: u.grant}
		g.mu.Unlock()
		return a, nil
	}
	g.mu.Unlock()
	r, err := u.cl.UserGrant(ctx)
	if err != nil {
		return protocol.Authority{}, err
	}
	if r.User == "" {
		// A grant over every session would let one caller reach another's
		// tasks: refuse to act with one (docs/security.md).
		return protocol.Authority{}, protocol.Errorf(protocol.CodeUnauthorized, "the coordinator minted a grant over every session for user %s; the gateway acts only with user-scoped grants", u.cl.User())
	}
	g.mu.Lock()
	u.grant, u.expires = r.Grant, time.UnixMilli(r.ExpiresAt)
	g.mu.Unlock()
	return protocol.Authority{Grant: r.Grant}, nil
}

func (g *Gateway) String() string { return fmt.Sprintf("a2a-gateway %s", g.cfg.Listen) }
