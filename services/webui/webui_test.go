package webui

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// stackServer starts a stack (a coordinator, a spawn worker) and a web view
// on a loopback port that reads it with a grant it mints; cfg sets the rest.
func stackServer(t *testing.T, cfg Config) (*stack.Stack, *Server) {
	t.Helper()
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	cl, err := client.New(s.Conn(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Client, cfg.Listen, cfg.Logger = cl, "127.0.0.1:0", testutil.Logger(t)
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Background(t, srv)
	return s, srv
}

func TestListenBeyondLoopbackNeedsAToken(t *testing.T) {
	cl := &client.Client{}
	for _, tt := range []struct {
		listen, token string
		ok            bool
	}{
		{"127.0.0.1:0", "", true},
		{"localhost:0", "", true},
		{"[::1]:0", "", true},
		{"0.0.0.0:0", "", false},
		{":0", "", false},
		{"0.0.0.0:0", "secret", true},
		{"nonsense", "", false},
	} {
		s, err := New(Config{Client: cl, Listen: tt.listen, AccessToken: tt.token})
		if (err == nil) != tt.ok {
			t.Errorf("listen %q token %q: %v", tt.listen, tt.token, err)
		}
		if err != nil && protocol.CodeOf(err) != protocol.CodeInvalidArgument {
			t.Errorf("listen %q: %v is not INVALID_ARGUMENT", tt.listen, err)
		}
		if s != nil {
			_ = s.ln.Close()
		}
	}
}

func get(t *testing.T, h http.Handler, target string, mod func(*http.Request)) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, target, nil)
	if mod != nil {
		mod(req)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// On loopback without a token, only loopback Host names are served: a page
// elsewhere that rebinds its name to 127.0.0.1 gets nothing.
func TestLoopbackServesLoopbackHostsOnly(t *testing.T) {
	s, err := New(Config{Client: &client.Client{}, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.ln.Close()
	h := s.Handler()
	for host, want := range map[string]int{
		"127.0.0.1:8377": 200, "localhost:8377": 200, "[::1]:8377": 200, "localhost": 200,
		"evil.example:8377": 403, "192.168.1.5:8377": 403,
	} {
		if got := get(t, h, "/", func(r *http.Request) { r.Host = host }).Code; got != want {
			t.Errorf("Host %s: %d, want %d", host, got, want)
		}
	}
	rec := get(t, h, "/static/app.js", func(r *http.Request) { r.Host = "127.0.0.1:8377" })
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "EventSource") {
		t.Fatalf("app.js: %d", rec.Code)
	}
	if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("CSP %q", csp)
	}
}

func TestAccessToken(t *testing.T) {
	s, err := New(Config{Client: &client.Client{}, Listen: "127.0.0.1:0", AccessToken: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.ln.Close()
	h := s.Handler()
	if got := get(t, h, "/", nil).Code; got != http.StatusUnauthorized {
		t.Errorf("no token: %d", got)
	}
	if got := get(t, h, "/?token=wrong", nil).Code; got != http.StatusUnauthorized {
		t.Errorf("wrong token: %d", got)
	}
	if got := get(t, h, "/static/app.css", func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret") }).Code; got != 200 {
		t.Errorf("bearer: %d", got)
	}
	rec := get(t, h, "/?token=s3cret", nil)
	if rec.Code != http.StatusSeeOther || len(rec.Result().Cookies()) != 1 {
		t.Fatalf("token link: %d, cookies %v", rec.Code, rec.Result().Cookies())
	}
	c := rec.Result().Cookies()[0]
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode {
		t.Errorf("cookie %+v", c)
	}
	if got := get(t, h, "/", func(r *http.Request) { r.AddCookie(c) }).Code; got != 200 {
		t.Errorf("with the cookie: %d", got)
	}
	// With a token, any Host is served (it is the credential that counts).
	if got := get(t, h, "/", func(r *http.Request) { r.AddCookie(c); r.Host = "brood.example.com" }).Code; got != 200 {
		t.Errorf("other host with the cookie: %d", got)
	}
}

func lifecycle(typ, id, parent, mode string, at int64, stop protocol.StopReason) protocol.LifecycleEvent {
	return protocol.LifecycleEvent{Type: typ, ID: id, ParentSession: parent, Provider: "spawn", Mode: mode, Time: at, StopReason: stop, RunID: id + "-run"}
}

func TestTreeFoldsLifecycleEvents(t *testing.T) {
	h := newHub(nil, nil, 4, testutil.Logger(t))
	snap, ch := h.subscribe()
	if len(snap) != 0 {
		t.Fatalf("snapshot %v", snap)
	}
	h.apply(lifecycle(protocol.LifecycleStart, "a", "root", protocol.ModeOneShot, 10, ""))
	got := map[string]Node{}
	for _, n := range <-ch {
		got[n.ID] = n
	}
	if got["a"].State != StateRunning || got["a"].Parent != "root" || got["a"].Start != 10 || !got["root"].Root || got["root"].State != StateRoot {
		t.Fatalf("after a start: %+v", got)
	}
	h.apply(lifecycle(protocol.LifecycleEnd, "a", "root", protocol.ModeOneShot, 25, protocol.StopCompleted),
		lifecycle(protocol.LifecycleStart, "c", "a", protocol.ModeContinuable, 30, ""),
		lifecycle(protocol.LifecycleEnd, "c", "a", protocol.ModeContinuable, 40, protocol.StopCompleted),
		lifecycle(protocol.LifecycleStart, "c", "a", protocol.ModeContinuable, 50, ""))
	<-ch
	snap, _ = h.subscribe()
	got = map[string]Node{}
	for _, n := range snap {
		got[n.ID] = n
	}
	if a := got["a"]; a.State != StateSettled || a.StopReason != "completed" || a.End != 25 || a.Root {
		t.Errorf("a: %+v", a)
	}
	if c := got["c"]; c.State != StateRunning || c.Epochs != 2 || c.Start != 30 || c.StopReason != "" {
		t.Errorf("c after its second epoch started: %+v", c)
	}
	h.apply(lifecycle(protocol.LifecycleEnd, "c", "a", protocol.ModeContinuable, 60, protocol.StopCompleted))
	snap, _ = h.subscribe()
	for _, n := range snap {
		if n.ID == "c" && n.State != StateIdle {
			t.Errorf("a continuable child between epochs is idle: %+v", n)
		}
	}
	// Beyond NodesMax the oldest settled nodes go (never a running one, nor
	// a root that still has children).
	h.apply(lifecycle(protocol.LifecycleStart, "d", "root", protocol.ModeOneShot, 70, ""),
		lifecycle(protocol.LifecycleStart, "e", "root", protocol.ModeOneShot, 80, ""))
	snap, _ = h.subscribe()
	ids := []string{}
	for _, n := range snap {
		ids = append(ids, n.ID)
	}
	if strings.Join(ids, ",") != "root,c,d,e" {
		t.Fatalf("kept %v, want root, c, d, e (a is the oldest settled)", ids)
	}
	// A root whose children all went goes too.
	t2 := NewTree(1)
	t2.Apply(lifecycle(protocol.LifecycleStart, "x", "r1", protocol.ModeOneShot, 1, ""),
		lifecycle(protocol.LifecycleEnd, "x", "r1", protocol.ModeOneShot, 2, protocol.StopCompleted))
	if n := t2.Nodes(); len(n) != 0 {
		t.Fatalf("after trimming its only child the root stays: %+v", n)
	}
}

// A stack-backed check of the JSON API the page reads: the tree stream and a
// session's log stream through the coordinator with a minted grant.
func TestStreams(t *testing.T) {
	s, srv := stackServer(t, Config{StreamsMax: 2})
	root := s.Root()
	run, err := s.Client.StartRun(context.Background(), protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text("say hello")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.Result(context.Background()); err != nil {
		t.Fatal(err)
	}
	base := "http://" + srv.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open := func(path string) (*bufio.Reader, func()) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
		}
		return bufio.NewReader(resp.Body), func() { resp.Body.Close() }
	}
	// next reads the next event of a stream: its name and data.
	next := func(r *bufio.Reader) (string, string) {
		var name, data string
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("stream ended: %v", err)
			}
			line = strings.TrimRight(line, "\n")
			switch {
			case strings.HasPrefix(line, "event: "):
				name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				data = strings.TrimPrefix(line, "data: ")
			case line == "" && name != "":
				return name, data
			}
		}
	}
	// The tree first, then the nodes that change, until the child is seen
	// settled (lifecycle events are published just after the result).
	tree, closeTree := open("/api/tree")
	name, data := next(tree)
	if name != "tree" {
		t.Fatalf("the tree stream starts with %q", name)
	}
	for !strings.Contains(data, `"id":"`+run.ChildID+`"`) || !strings.Contains(data, `"stopReason":"completed"`) {
		if name, data = next(tree); name != "nodes" { // the test's deadline bounds this
			t.Fatalf("tree stream: %s %s", name, data)
		}
	}
	log, closeLog := open("/api/sessions/" + run.ChildID + "/log")
	if name, data := next(log); name != "header" || !strings.Contains(data, `"parentSession":"`+root.SessionID+`"`) {
		t.Fatalf("log header: %s %s", name, data)
	}
	if name, data := next(log); name != "events" || !strings.Contains(data, `"type":"turn/start"`) || !strings.Contains(data, `"hello"`) {
		t.Fatalf("log events: %s %s", name, data)
	}
	// StreamsMax (2) are open: a third is refused.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/tree", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("third stream: %d", resp.StatusCode)
	}
	closeTree()
	closeLog()
	// An unknown session is 404, as JSON.
	resp, err = http.Get(base + "/api/sessions/NOSUCHSESSION")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "NOT_FOUND") {
		t.Fatalf("unknown session: %d %s", resp.StatusCode, body)
	}
}

// TestTreeSumsUsagePerRun: a node's usage sums its ended runs' or epochs'
// (end events), each run once: a copy of an end republished after a host
// loss adds nothing (docs/protocol.md §6.6).
func TestTreeSumsUsagePerRun(t *testing.T) {
	tr := NewTree(10)
	end := func(run string, own, sub int64) protocol.LifecycleEvent {
		ev := lifecycle(protocol.LifecycleEnd, "c", "root", protocol.ModeContinuable, 10, protocol.StopCompleted)
		ev.RunID = run
		ev.Usage = &protocol.UsageSummary{Own: protocol.RunUsage{InputTokens: own, ModelRequests: 1}, Subtree: protocol.RunUsage{InputTokens: sub, ModelRequests: 2}}
		return ev
	}
	tr.Apply(lifecycle(protocol.LifecycleStart, "c", "root", protocol.ModeContinuable, 1, ""))
	if n := tr.Apply(end("e1", 5, 20))[0]; n.Usage == nil || n.Usage.Own.InputTokens != 5 || n.Usage.Subtree.InputTokens != 20 {
		t.Fatalf("after one epoch: %+v", n.Usage)
	}
	tr.Apply(end("e1", 5, 20)) // the same end again
	var got Node
	for _, n := range tr.Apply(end("e2", 7, 7)) {
		if n.ID == "c" {
			got = n
		}
	}
	want := protocol.UsageSummary{Own: protocol.RunUsage{InputTokens: 12, ModelRequests: 2}, Subtree: protocol.RunUsage{InputTokens: 27, ModelRequests: 4}}
	if got.Usage == nil || *got.Usage != want {
		t.Fatalf("after two epochs and a copy: %+v, want %+v", got.Usage, want)
	}
}
