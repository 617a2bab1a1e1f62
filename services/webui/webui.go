// Package webui is Brood's web view (`brood ui`, `brood dev --ui`): the live
// tree of roots and their descendants, and any session's log shown as a
// conversation that follows live turns. The page is plain HTML, CSS and
// JavaScript embedded in the binary; it reads JSON and server-sent events
// from this server, which reads through the coordinator's read endpoints
// (sessions.get, sessions.log, events.read, events.follow) with a user
// grant, like any client: it holds no JetStream permission. With the same
// grant it lists the pending requests and questions (requests.list) and
// answers them (requests.answer; requests.go).
//
// HTTP routes:
//
//	GET /                          the page
//	GET /static/{app.js,app.css}   its script and style
//	GET /api/tree                  event stream: "tree" (every node now), then "nodes" (nodes that changed)
//	GET /api/sessions/{id}         the session's header (JSON)
//	GET /api/sessions/{id}/log     event stream: "header", then "events" (pages from ?from=N on, then each new page)
//	GET /api/providers             providers.list: the live providers, each with its models (adapter and id)
//	POST /api/sessions/{id}/interrupt  continuable.interrupt with the view's grant: {childId, interrupted}
//	POST /api/sessions/{id}/dispose    as `brood dispose ID`: a one-shot run's runs.dispose ({runId, state, ...}),
//	                                   else continuable.drain of that child ({childId, disposed})
//	GET /api/requests              requests.list: the pending requests and questions the grant may answer
//	                               ({requests, more}; ?all=1 answered ones too, ?under=ID that subtree's)
//	POST /api/requests/{id}/answer requests.answer with the view's grant: {answer: approve|deny|answer,
//	                               reason?, text?, json?} → the answered record, or the coordinator's error
//
// The tree stream also sends "requests" (the pending requests, as GET
// /api/requests answers them) when the list changes, listed once a second
// while a page is open.
//
// The POSTs act with the same user grant as the reads, so the page has
// the authority of `brood interrupt`, `brood dispose`, `brood approve`,
// `brood deny` and `brood answer` run with that grant; each must carry the header X-Brood-Action: 1, which a page of
// another origin cannot send without a CORS preflight this server never
// answers (so a cross-site form cannot dispose anything).
//
// Who may look: the server reads everything its grant may, so on loopback
// (the default) only requests whose Host is a loopback name are served (a
// web page elsewhere cannot rebind a name to it), and beyond loopback an
// access token is required: `Authorization: Bearer TOKEN`, or the cookie
// that /?token=TOKEN sets.
package webui

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/brood-dev/brood/internal/httpauth"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

//go:embed static
var static embed.FS

// Defaults of Config.
const (
	StreamsMaxDefault = 64
	NodesMaxDefault   = 50_000
	// LogWait is how long one log read waits for new events (a long poll).
	LogWait = 15 * time.Second
	// KeepAlive is how often an idle event stream sends a comment, so
	// proxies keep it open.
	KeepAlive = 15 * time.Second
	// GrantRenewBefore is how long before its expiry a minted grant is
	// replaced.
	GrantRenewBefore = time.Hour
	cookieName       = "brood_ui_token"
)

// Config configures the web view.
type Config struct {
	// Client reads through the coordinator.
	Client *client.Client
	// Listen is host:port (port 0 picks one).
	Listen string
	// Grant is the user grant the server reads with; empty: one is minted
	// with authority.user (and renewed before it expires), retried until a
	// coordinator answers.
	Grant string
	// AccessToken, when set, is required of every request; it must be set
	// when Listen is not a loopback address.
	AccessToken string
	// StreamsMax bounds the open event streams (64); more are refused 503.
	StreamsMax int
	// NodesMax bounds the tree kept in memory (50,000 nodes); the oldest
	// settled ones go first.
	NodesMax int
	Logger   *slog.Logger
}

// Server is a running web view.
type Server struct {
	cfg      Config
	log      *slog.Logger
	ln       net.Listener
	srv      *http.Server
	hub      *hub
	reqs     *requestsWatch
	streams  chan struct{}
	loopback bool

	mu    sync.Mutex
	grant string
	ready chan struct{} // closed once a grant is held
}

// New validates cfg and listens, so a busy address or a missing access
// token fails before anything runs.
func New(cfg Config) (*Server, error) {
	if cfg.Client == nil {
		return nil, errors.New("webui: Client is required")
	}
	if cfg.StreamsMax <= 0 {
		cfg.StreamsMax = StreamsMaxDefault
	}
	if cfg.NodesMax <= 0 {
		cfg.NodesMax = NodesMaxDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "listen address %q: %w (want host:port)", cfg.Listen, err)
	}
	loopback := httpauth.IsLoopback(host)
	if !loopback && cfg.AccessToken == "" {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument,
			"%s is not a loopback address: the web view reads every session with a user grant, so beyond loopback it needs an access token (--access-token or $BROOD_UI_TOKEN)", cfg.Listen)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "cannot listen on %s: %w; choose another address (port 0 picks a free one)", cfg.Listen, err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "webui"), ln: ln, loopback: loopback,
		streams: make(chan struct{}, cfg.StreamsMax), grant: cfg.Grant, ready: make(chan struct{})}
	if cfg.Grant != "" {
		close(s.ready)
	}
	s.hub = newHub(cfg.Client, s.authority, cfg.NodesMax, s.log)
	s.reqs = newRequestsWatch(s.listPending)
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// URL is the page's address (with the access token, when one is set).
func (s *Server) URL() string {
	u := "http://" + s.Addr() + "/"
	if s.cfg.AccessToken != "" {
		u += "?token=" + s.cfg.AccessToken
	}
	return u
}

func (s *Server) authority() protocol.Authority {
	s.mu.Lock()
	defer s.mu.Unlock()
	return protocol.Authority{Grant: s.grant}
}

// Run serves until ctx is done, then closes every stream and returns nil.
func (s *Server) Run(ctx context.Context) error {
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(1)
	denied := make(chan error, 1)
	go func() {
		defer wg.Done()
		if s.cfg.Grant == "" {
			if err := s.mintLoop(bg); err != nil {
				denied <- err
				return
			}
			if bg.Err() != nil {
				return
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.reqs.run(bg)
		}()
		s.hub.run(bg)
	}()
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	var err error
	select {
	case err = <-errc:
	case err = <-denied:
		// NATS refuses this user the grant: the view could never read.
		_ = s.srv.Close()
		<-errc
	case <-ctx.Done():
		_ = s.srv.Close()
		if e := <-errc; !errors.Is(e, http.ErrServerClosed) {
			err = e
		}
	}
	stop()
	wg.Wait()
	return err
}

// mintLoop mints the grant the server reads with, retrying until a
// coordinator answers, then replaces it before it expires. It returns at
// once when ctx ended first (nil), or with the refusal when NATS refuses
// the connection's user the grant's subject (PERMISSION_DENIED: a user of
// another role, which no retry changes).
func (s *Server) mintLoop(ctx context.Context) error {
	var expires time.Time
	for attempt := 0; ; attempt++ {
		r, err := s.cfg.Client.UserGrant(ctx)
		if err == nil {
			s.mu.Lock()
			s.grant = r.Grant
			s.mu.Unlock()
			expires = time.UnixMilli(r.ExpiresAt)
			break
		}
		if errors.Is(err, protocol.ErrPermissionDenied) {
			return err
		}
		if attempt%20 == 10 { // a coordinator starting with it answers within the first attempts
			s.log.Warn("cannot mint the user grant the web view reads with; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(min(time.Duration(attempt+1)*100*time.Millisecond, time.Second)):
		}
	}
	close(s.ready)
	go func() {
		for {
			wait := time.Until(expires) - GrantRenewBefore
			select {
			case <-ctx.Done():
				return
			case <-time.After(max(wait, time.Minute)):
			}
			r, err := s.cfg.Client.UserGrant(ctx)
			if err != nil {
				s.log.Warn("cannot renew the web view's user grant", "err", err)
				continue
			}
			s.mu.Lock()
			s.grant = r.Grant
			s.mu.Unlock()
			expires = time.UnixMilli(r.ExpiresAt)
		}
	}()
	return nil
}

// Handler is the web view's HTTP handler (the page and its API), with the
// access checks.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	assets, _ := fs.Sub(static, "static")
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.AccessToken != "" && r.URL.Query().Get("token") != "" {
			http.SetCookie(w, &http.Cookie{Name: cookieName, Value: r.URL.Query().Get("token"), Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
			http.Redirect(w, r, "/", http.StatusSeeOther)
			return
		}
		http.ServeFileFS(w, r, assets, "index.html")
	})
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(assets)))
	mux.HandleFunc("GET /api/tree", s.treeStream)
	mux.HandleFunc("GET /api/sessions/{id}", s.header)
	mux.HandleFunc("GET /api/sessions/{id}/log", s.logStream)
	mux.HandleFunc("GET /api/providers", s.providers)
	mux.HandleFunc("POST /api/sessions/{id}/interrupt", s.interrupt)
	mux.HandleFunc("POST /api/sessions/{id}/dispose", s.dispose)
	mux.HandleFunc("GET /api/requests", s.requests)
	mux.HandleFunc("POST /api/requests/{id}/answer", s.answer)
	mux.HandleFunc("POST /api/sessions/{id}/budget/raise", s.raiseBudget)
	return s.guard(mux)
}

// guard serves a request only from a loopback Host (without a token) or
// with the access token.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self' data:")
		if s.cfg.AccessToken == "" {
			if !httpauth.HostIsLoopback(r) {
				http.Error(w, "this web view answers loopback names only (Host "+r.Host+")", http.StatusForbidden)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		if r.URL.Path == "/" && r.URL.Query().Get("token") != "" {
			if !s.tokenOK(r.URL.Query().Get("token")) {
				http.Error(w, "wrong access token", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		tok := ""
		if b := httpauth.Bearer(r); b != "" {
			tok = b
		} else if c, err := r.Cookie(cookieName); err == nil {
			tok = c.Value
		}
		if !s.tokenOK(tok) {
			http.Error(w, "an access token is required: open /?token=TOKEN or send Authorization: Bearer TOKEN", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) tokenOK(tok string) bool {
	return httpauth.TokenOK(tok, s.cfg.AccessToken)
}

// waitReady waits until the server holds a grant (bounded by the request).
func (s *Server) waitReady(w http.ResponseWriter, r *http.Request) bool {
	select {
	case <-s.ready:
		return true
	case <-r.Context().Done():
		return false
	case <-time.After(30 * time.Second):
		http.Error(w, "the web view has no user grant yet: is a coordinator running?", http.StatusServiceUnavailable)
		return false
	}
}

func writeError(w http.ResponseWriter, err error) {
	pe := protocol.AsError(err)
	status := http.StatusBadGateway
	switch pe.Code {
	case protocol.CodeNotFound:
		status = http.StatusNotFound
	case protocol.CodeInvalidArgument:
		status = http.StatusBadRequest
	case protocol.CodeUnauthorized:
		status = http.StatusForbidden
	case protocol.CodeAlreadyAnswered:
		status = http.StatusConflict
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(pe)
}

// header answers a session's header as JSON.
func (s *Server) header(w http.ResponseWriter, r *http.Request) {
	if !s.waitReady(w, r) {
		return
	}
	h, err := s.cfg.Client.Header(r.Context(), protocol.SessionGetRequest{SessionID: r.PathValue("id"), Authority: s.authority()})
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(h)
}

// ActionHeader must be set (to "1") on the page's POSTs: a custom header a
// cross-origin page cannot send without a preflight.
const ActionHeader = "X-Brood-Action"

// ActionTimeout bounds one interrupt, dispose or answer from the page (a dispose
// waits for the run to settle: runs.dispose's own wait, 20 s, and a drain's).
const ActionTimeout = 60 * time.Second

// action checks an action request's origin header and grant.
func (s *Server) action(w http.ResponseWriter, r *http.Request) (context.Context, context.CancelFunc, bool) {
	if r.Header.Get(ActionHeader) != "1" {
		http.Error(w, "actions need the header "+ActionHeader+": 1 (sent by the page)", http.StatusForbidden)
		return nil, nil, false
	}
	if !s.waitReady(w, r) {
		return nil, nil, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), ActionTimeout)
	return ctx, cancel, true
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// providers answers providers.list (the page shows each provider's model).
func (s *Server) providers(w http.ResponseWriter, r *http.Request) {
	reply, err := s.cfg.Client.Providers(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, reply)
}

// interrupt stops a continuable child's current turn (continuable.interrupt
// with the view's grant, cause user).
func (s *Server) interrupt(w http.ResponseWriter, r *http.Request) {
	ctx, cancel, ok := s.action(w, r)
	if !ok {
		return
	}
	defer cancel()
	reply, err := s.cfg.Client.Interrupt(ctx, protocol.InterruptRequest{ChildID: r.PathValue("id"), Authority: s.authority()})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, reply)
}

// dispose ends a child as `brood dispose ID` does: a one-shot run (the
// tree's run id, else the id itself) through runs.dispose, which answers
// its settled status; a continuable child (or an id runs.dispose does not
// know) through continuable.drain of that child and its subtree.
func (s *Server) dispose(w http.ResponseWriter, r *http.Request) {
	ctx, cancel, ok := s.action(w, r)
	if !ok {
		return
	}
	defer cancel()
	id := r.PathValue("id")
	n, known := s.hub.node(id)
	if !known || n.Mode != protocol.ModeContinuable {
		runID := id
		if known && n.RunID != "" {
			runID = n.RunID
		}
		st, err := s.cfg.Client.Dispose(ctx, protocol.RunRef{RunID: runID, Grant: s.authority().Grant})
		if err == nil {
			writeJSON(w, st)
			return
		}
		// Not a run the grant knows: a continuable child (a grant of one
		// user is told UNAUTHORIZED for an unknown run id, authority
		// before existence; the drain below answers for the child).
		if !errors.Is(err, protocol.ErrNotFound) && !errors.Is(err, protocol.ErrUnauthorized) && !errors.Is(err, protocol.ErrInvalidArgument) {
			writeError(w, err)
			return
		}
	}
	reply, err := s.cfg.Client.Drain(ctx, protocol.DrainRequest{Authority: s.authority(), Children: []string{id}})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, struct {
		ChildID string `json:"childId"`
		protocol.DrainReply
	}{id, reply})
}

// sse is one server-sent event stream.
type sse struct {
	w http.ResponseWriter
	f http.Flusher
}

// openStream starts an event stream, or answers 503 when StreamsMax are
// open; release it with the returned func.
func (s *Server) openStream(w http.ResponseWriter) (*sse, func(), bool) {
	f, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return nil, nil, false
	}
	select {
	case s.streams <- struct{}{}:
	default:
		http.Error(w, fmt.Sprintf("too many open streams (%d); close a tab", s.cfg.StreamsMax), http.StatusServiceUnavailable)
		return nil, nil, false
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	f.Flush()
	return &sse{w: w, f: f}, func() { <-s.streams }, true
}

func (e *sse) send(event string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(e.w, "event: %s\ndata: %s\n\n", event, data); err != nil {
		return err
	}
	e.f.Flush()
	return nil
}

func (e *sse) keepAlive() error {
	if _, err := fmt.Fprint(e.w, ": keep-alive\n\n"); err != nil {
		return err
	}
	e.f.Flush()
	return nil
}

// treeStream sends the whole tree, then the nodes that change, and the
// pending requests whenever they change.
func (s *Server) treeStream(w http.ResponseWriter, r *http.Request) {
	if !s.waitReady(w, r) {
		return
	}
	select {
	case <-s.hub.ready:
	case <-r.Context().Done():
		return
	}
	st, release, ok := s.openStream(w)
	if !ok {
		return
	}
	defer release()
	snap, ch := s.hub.subscribe()
	defer s.hub.unsubscribe(ch)
	if st.send("tree", snap) != nil {
		return
	}
	reqs, rch := s.reqs.subscribe()
	defer s.reqs.unsubscribe(rch)
	if reqs != nil && st.send("requests", json.RawMessage(reqs)) != nil {
		return
	}
	tick := time.NewTicker(KeepAlive)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case nodes, ok := <-ch:
			if !ok || st.send("nodes", nodes) != nil {
				return // fell behind: the page reconnects and gets the tree again
			}
		case l := <-rch:
			if st.send("requests", json.RawMessage(l)) != nil {
				return
			}
		case <-tick.C:
			if st.keepAlive() != nil {
				return
			}
		}
	}
}

// logStream sends the session's header, then its events from ?from=N on,
// page by page, then each new page as the log grows (a long poll each).
func (s *Server) logStream(w http.ResponseWriter, r *http.Request) {
	if !s.waitReady(w, r) {
		return
	}
	id := r.PathValue("id")
	from := int64(0)
	if v := r.URL.Query().Get("from"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "from must be an event seq (0 or more)", http.StatusBadRequest)
			return
		}
		from = n
	}
	ctx := r.Context()
	h, err := s.cfg.Client.Header(ctx, protocol.SessionGetRequest{SessionID: id, Authority: s.authority()})
	if err != nil {
		writeError(w, err)
		return
	}
	st, release, ok := s.openStream(w)
	if !ok {
		return
	}
	defer release()
	if st.send("header", h) != nil {
		return
	}
	var cursor protocol.Seq
	last := time.Now()
	for ctx.Err() == nil {
		page, err := s.cfg.Client.LogPage(ctx, protocol.LogReadRequest{
			SessionID: id, Authority: s.authority(), FromSeq: from, Cursor: cursor,
			EventsMax: protocol.LogPageEventsMax, WaitMs: LogWait.Milliseconds(),
		})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			_ = st.send("failure", protocol.AsError(err))
			select {
			case <-ctx.Done():
				return
			case <-time.After(2 * time.Second):
			}
			continue
		}
		if len(page.Events) > 0 {
			if st.send("events", page.Events) != nil {
				return
			}
			last = time.Now()
		} else if time.Since(last) >= KeepAlive {
			if st.keepAlive() != nil {
				return
			}
			last = time.Now()
		}
		from, cursor = page.NextSeq, page.Cursor
	}
}
