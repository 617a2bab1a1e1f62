package mcpserver_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	mcpserver "github.com/brood-dev/brood/services/mcp-server"
)

// bearer adds an Authorization header to every request of an HTTP client.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// TestHTTPCallersNeedLoopbackOrTheToken: every caller of `brood mcp
// --listen` acts as the server's Brood user, so a server beyond loopback
// needs an access token (refused at New without one), a server with a token
// answers only requests that carry it, and a server without one answers only
// loopback Host names (a page elsewhere cannot rebind a name to it).
func TestHTTPCallersNeedLoopbackOrTheToken(t *testing.T) {
	f := newFleet(t)
	cl, err := client.New(f.NC, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	for _, listen := range []string{"0.0.0.0:0", "192.0.2.1:0", "[::]:0", "example.com:0"} {
		_, err := mcpserver.New(mcpserver.Config{Client: cl, Cwd: t.TempDir(), Listen: listen})
		if protocol.CodeOf(err) != protocol.CodeInvalidArgument || !strings.Contains(err.Error(), "access token") {
			t.Errorf("New(Listen %s) without a token = %v, want INVALID_ARGUMENT naming the access token", listen, err)
		}
	}
	serve := func(token string) string {
		srv, err := mcpserver.New(mcpserver.Config{Client: cl, Cwd: t.TempDir(), Listen: "127.0.0.1:0", AccessToken: token, Logger: testutil.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		testutil.Background(t, srv)
		<-srv.Ready()
		return "http://" + srv.Addr().String() + "/mcp"
	}
	connect := func(endpoint string, hc *http.Client) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, nil)
		sess, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, MaxRetries: -1}, nil)
		if err != nil {
			return err
		}
		defer func() { _ = sess.Close() }()
		_, err = sess.CallTool(ctx, &mcp.CallToolParams{Name: "providers", Arguments: map[string]any{}})
		return err
	}
	withToken := serve("s3cret-token")
	for _, tc := range []struct {
		name string
		hc   *http.Client
		ok   bool
	}{
		{"no token", nil, false},
		{"wrong token", &http.Client{Transport: bearer{"wrong"}}, false},
		{"the token", &http.Client{Transport: bearer{"s3cret-token"}}, true},
	} {
		err := connect(withToken, tc.hc)
		if (err == nil) != tc.ok {
			t.Errorf("%s: connect and call = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
	req, err := http.NewRequest(http.MethodPost, withToken, strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST without a token: %v %v, want 401", res, err)
	} else {
		_ = res.Body.Close()
	}

	loopbackOnly := serve("")
	if err := connect(loopbackOnly, nil); err != nil {
		t.Errorf("loopback caller without a token: %v", err)
	}
	req, err = http.NewRequest(http.MethodPost, loopbackOnly, strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "rebound.example:80"
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("POST with Host %s = %d, want 403", req.Host, res.StatusCode)
	}
}
