// Package mcpserver is `brood mcp` (docs/mcp.md): an MCP server, built on
// the official MCP Go SDK, whose tools let an MCP host's model run a Brood
// fleet: delegate to a provider (one-shot, with an output schema, or
// continuable), follow up a continuable child, read a child's state and
// result, list children, interrupt and dispose. It serves MCP over stdio or
// over streamable HTTP on an address given.
//
// It is a Brood client like the CLI (pkg/client): it authenticates as the
// NATS user of its connection and needs no more NATS permission than the
// `client` role (docs/security.md): requests to the coordinator on its own
// user's subjects, replies under its own inbox prefix. What it delegates
// starts from one root agent it opens on first use (in Config.Cwd) and keeps
// alive while it runs; it acts on children with a user grant, so it reaches
// only the trees of the roots its user opened (the coordinator refuses
// anyone else's ids, UNAUTHORIZED).
//
// A long delegation never holds a tool call open past a bound: delegate,
// followup and result wait up to `waitSeconds` (default WaitDefault, at most
// WaitMax) for the child to answer, and otherwise answer at once with the
// child's ids and state, for the host to poll (`result`, `state`) or wait
// again.
//
// Each tool call continues the W3C trace context the host put in the
// request's `_meta` (`traceparent`, `tracestate`, `baggage`), so the host's
// trace is the parent of Brood's spans (docs/mcp.md, "Tracing").
//
// Seams: answering a child's approval or question and budgets are not
// served yet (those capabilities have not landed in Brood); a result will
// say what the child spent once they do.
package mcpserver

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/brood-dev/brood/internal/httpauth"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/tracecontext"
)

// Bounds of a tool call's wait for a child's answer.
const (
	// WaitDefault is how long delegate, followup and result wait when the
	// call gives no waitSeconds.
	WaitDefault = 30 * time.Second
	// WaitMax caps waitSeconds: a host's tool call never hangs longer.
	WaitMax = 5 * time.Minute
	// statePoll is how often a wait on a continuable child asks its state.
	statePoll = 200 * time.Millisecond
	// grantRenewBefore re-mints the user grant this long before it expires.
	grantRenewBefore = time.Minute
	// shutdownTimeout bounds the HTTP server's drain and the root's close.
	shutdownTimeout = 10 * time.Second
	// httpReadHeaderTimeout bounds a request's headers (slowloris).
	httpReadHeaderTimeout = 10 * time.Second
)

// Config configures the MCP server.
type Config struct {
	// Client talks to the coordinators as the server's Brood user.
	Client *client.Client
	// Cwd is the workspace of the root agent delegations start from
	// (absolute).
	Cwd string
	// Listen, when set, serves streamable HTTP on that address
	// (host:port; port 0 picks one: Addr tells which) at path /mcp.
	// Empty serves stdio on In and Out.
	Listen string
	// AccessToken, when set, is required of every HTTP request as
	// `Authorization: Bearer TOKEN` (401 without it). Without one, Listen
	// must be a loopback address and only requests whose Host is a
	// loopback name are served (403 otherwise): every caller acts as the
	// server's Brood user (internal/httpauth, docs/security.md).
	AccessToken string
	// In and Out carry stdio's messages (default os.Stdin and os.Stdout
	// are the caller's to pass). Nothing else may write to Out.
	In  io.Reader
	Out io.Writer
	// Version is reported to hosts as the server's version.
	Version string
	Logger  *slog.Logger
}

// Server is `brood mcp`.
type Server struct {
	cfg  Config
	log  *slog.Logger
	mcp  *mcp.Server
	http *mcp.StreamableHTTPHandler

	ready     chan struct{}
	readyOnce sync.Once
	addr      net.Addr

	mu       sync.Mutex
	root     *client.Root
	grant    string
	grantEnd time.Time
}

// New checks cfg and returns the server; Run serves it.
func New(cfg Config) (*Server, error) {
	if cfg.Client == nil {
		return nil, errors.New("mcp: Client is required")
	}
	if cfg.Cwd == "" {
		return nil, errors.New("mcp: Cwd is required")
	}
	if cfg.Listen == "" && (cfg.In == nil || cfg.Out == nil) {
		return nil, errors.New("mcp: In and Out are required without Listen")
	}
	if cfg.Listen != "" && cfg.AccessToken == "" {
		host, _, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "mcp: listen address %q: %v (want host:port)", cfg.Listen, err)
		}
		if !httpauth.IsLoopback(host) {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument,
				"mcp: %s is not a loopback address: every caller acts as this server's Brood user, so beyond loopback it needs an access token ($BROOD_MCP_TOKEN)", cfg.Listen)
		}
	}
	if cfg.Version == "" {
		cfg.Version = "0.1.0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, log: cfg.Logger, ready: make(chan struct{})}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "brood", Title: "Brood", Version: cfg.Version}, &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       cfg.Logger.With("component", "mcp-sdk"),
	})
	s.addTools()
	s.http = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp }, &mcp.StreamableHTTPOptions{
		Logger: cfg.Logger.With("component", "mcp-http"),
	})
	return s, nil
}

const instructions = "Brood runs a fleet of agents. Use `providers` to see who can work, `delegate` to hand a task " +
	"to a provider's agent (one-shot, or continuable to talk to it again with `followup`), and `result`, `state`, " +
	"`children`, `interrupt` and `dispose` to follow and steer what you delegated. A delegation that takes longer " +
	"than waitSeconds answers with its ids: ask `result` again later."

// Handler is the streamable HTTP handler (what Run serves at /mcp with
// Listen), for a caller that serves HTTP itself.
func (s *Server) Handler() http.Handler { return s.http }

// Ready is closed once Run serves (with Listen: once it listens), or
// returned without serving (Addr stays nil).
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Addr is the HTTP address Run listens on, once Ready (nil on stdio).
func (s *Server) Addr() net.Addr { return s.addr }

// Run serves until ctx is done (HTTP) or the host disconnects (stdio: EOF on
// In is a clean stop, nil); then it closes the root it opened (its one-shot
// runs are disposed with it; continuable children live on).
func (s *Server) Run(ctx context.Context) error {
	defer s.closeRoot()
	defer s.isReady()
	if s.cfg.Listen == "" {
		s.isReady()
		err := s.mcp.Run(ctx, &mcp.IOTransport{Reader: io.NopCloser(s.cfg.In), Writer: nopWriteCloser{s.cfg.Out}})
		if err == nil || errors.Is(err, io.EOF) || ctx.Err() != nil {
			return nil
		}
		return err
	}
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return protocol.Errorf(protocol.CodeInvalidArgument, "mcp: listen on %s: %w", s.cfg.Listen, err)
	}
	s.addr = ln.Addr()
	mux := http.NewServeMux()
	mux.Handle("/mcp", s.guard(s.http))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: httpReadHeaderTimeout}
	s.isReady()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	<-errc
	return err
}

func (s *Server) isReady() { s.readyOnce.Do(func() { close(s.ready) }) }

// guard serves a request with the access token when one is set, else only
// a request whose Host is a loopback name (Config.AccessToken).
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case s.cfg.AccessToken != "":
			if !httpauth.TokenOK(httpauth.Bearer(r), s.cfg.AccessToken) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="brood-mcp"`)
				http.Error(w, "an access token is required: send Authorization: Bearer TOKEN", http.StatusUnauthorized)
				return
			}
		case !httpauth.HostIsLoopback(r):
			http.Error(w, "this MCP server answers loopback names only (Host "+r.Host+")", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// rootRef opens the root delegations start from, once (again after its
// lease was lost: reopen).
func (s *Server) rootRef(ctx context.Context, reopen bool) (protocol.ParentRef, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.root != nil && !reopen {
		return s.root.Ref(), nil
	}
	if s.root != nil {
		old := s.root
		s.root = nil
		go func() {
			cctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
			defer cancel()
			_ = old.Close(cctx)
		}()
	}
	root, err := s.cfg.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: s.cfg.Cwd, Label: "mcp"})
	if err != nil {
		return protocol.ParentRef{}, err
	}
	s.root = root
	s.log.Info("mcp: root opened", "session", root.SessionID)
	return root.Ref(), nil
}

// rootID is the session id of the root delegations start from ("" before
// the first).
func (s *Server) rootID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.root == nil {
		return ""
	}
	return s.root.SessionID
}

func (s *Server) closeRoot() {
	s.mu.Lock()
	root := s.root
	s.root = nil
	s.mu.Unlock()
	if root == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := root.Close(ctx); err != nil {
		s.log.Warn("mcp: close root", "session", root.SessionID, "err", err)
	}
}

// authority is the server's user grant (minted on first use, again shortly
// before it expires): it acts on the trees of the roots its user opened.
func (s *Server) authority(ctx context.Context) (protocol.Authority, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grant != "" && time.Until(s.grantEnd) > grantRenewBefore {
		return protocol.Authority{Grant: s.grant}, nil
	}
	g, err := s.cfg.Client.UserGrant(ctx)
	if err != nil {
		return protocol.Authority{}, err
	}
	s.grant, s.grantEnd = g.Grant, time.UnixMilli(g.ExpiresAt)
	return protocol.Authority{Grant: g.Grant}, nil
}

// traced continues the host's trace from the request's _meta (SEP-414:
// traceparent, tracestate, baggage) with the server span of the tool call.
func traced(ctx context.Context, req *mcp.CallToolRequest) (context.Context, trace.Span) {
	carrier := propagation.MapCarrier{}
	if req != nil && req.Params != nil {
		for k, v := range req.Params.Meta {
			if str, ok := v.(string); ok {
				carrier[k] = str
			}
		}
	}
	ctx = otel.GetTextMapPropagator().Extract(ctx, carrier)
	name := "mcp tools/call"
	if req != nil && req.Params != nil {
		name += " " + req.Params.Name
	}
	return otel.Tracer(tracecontext.TracerName).Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("rpc.system", "mcp")))
}

// handle wraps a tool's body: the trace, and an error as a tool error whose
// text starts with its catalogue code (docs/protocol.md §3).
func handle[In, Out any](fn func(ctx context.Context, in In) (Out, error)) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		ctx, span := traced(ctx, req)
		defer span.End()
		out, err := fn(ctx, in)
		if err != nil {
			pe := protocol.AsError(err)
			span.SetAttributes(attribute.String(tracecontext.AttrErrorCode, string(pe.Code)))
			span.SetStatus(codes.Error, pe.Error())
			var zero Out
			return nil, zero, errors.New(pe.Error())
		}
		return nil, out, nil
	}
}

// wait is a tool call's bound on waiting for an answer: seconds given (0 is
// not waiting), or WaitDefault when nil, capped at WaitMax.
func wait(seconds *float64) time.Duration {
	if seconds == nil {
		return WaitDefault
	}
	d := time.Duration(*seconds * float64(time.Second))
	if d < 0 {
		return 0
	}
	return min(d, WaitMax)
}

func invalid(format string, args ...any) error {
	return protocol.Errorf(protocol.CodeInvalidArgument, format, args...)
}
