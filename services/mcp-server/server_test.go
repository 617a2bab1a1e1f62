package mcpserver_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	mcpserver "github.com/brood-dev/brood/services/mcp-server"
)

// TestMain fails the package when a test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clientPerms is the NATS `client` role of a user (docs/security.md): calls
// to the coordinator on its own subjects, replies under its own inbox.
func clientPerms(user string) *server.Permissions {
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"brood.v1.user." + user + ".>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX." + user + ".>"}},
	}
}

// fleet is a stack whose services run as "svc" and whose MCP servers run as
// the client users alice and bob.
type fleet struct {
	*stack.Stack
	host string
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	srv := testutil.ServerWithUsers(t, []*server.User{
		{Username: "svc", Password: "svcpw"},
		{Username: "alice", Password: "alicepw", Permissions: clientPerms("alice")},
		{Username: "bob", Password: "bobpw", Permissions: clientPerms("bob")},
	})
	host := strings.TrimPrefix(srv.ClientURL(), "nats://")
	s := stack.At(t, srv, "nats://svc:svcpw@"+host)
	s.AddCoordinator()
	s.AddSpawnWorker()
	return &fleet{Stack: s, host: host}
}

// mcpAs starts `brood mcp` over streamable HTTP as user and connects the
// MCP Go SDK's client to it.
func (f *fleet) mcpAs(t *testing.T, user string) *mcp.ClientSession {
	t.Helper()
	nc, err := nats.Connect("nats://"+f.host, nats.UserInfo(user, user+"pw"), nats.CustomInboxPrefix(protocol.UserInboxPrefix(user)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cl, err := client.New(nc, client.Options{AwaitFallback: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	srv, err := mcpserver.New(mcpserver.Config{Client: cl, Cwd: t.TempDir(), Listen: "127.0.0.1:0", Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Background(t, srv)
	<-srv.Ready()
	c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + srv.Addr().String() + "/mcp"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sess.Close() })
	return sess
}

// call calls a tool and decodes its structured result into out; it returns
// the tool error's text ("" when the call succeeded).
func call(t *testing.T, sess *mcp.ClientSession, meta mcp.Meta, name string, args map[string]any, out any) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := sess.CallTool(ctx, &mcp.CallToolParams{Meta: meta, Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.IsError {
		var text []string
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				text = append(text, tc.Text)
			}
		}
		return strings.Join(text, "\n")
	}
	if out != nil {
		data, err := json.Marshal(res.StructuredContent)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s: decode %s: %v", name, data, err)
		}
	}
	return ""
}

func mustCall(t *testing.T, sess *mcp.ClientSession, name string, args map[string]any) mcpserver.Status {
	t.Helper()
	var st mcpserver.Status
	if msg := call(t, sess, nil, name, args, &st); msg != "" {
		t.Fatalf("%s %v: tool error %s", name, args, msg)
	}
	return st
}

// TestHostDelegatesWaitsFollowsUpAndDisposes drives `brood mcp` with the MCP
// Go SDK's client as a host would: a one-shot delegation that answers at
// once with its ids and is waited for with result; one with an output
// schema; a continuable child followed up and disposed; a running one-shot
// disposed (issue 35, acceptance).
func TestHostDelegatesWaitsFollowsUpAndDisposes(t *testing.T) {
	f := newFleet(t)
	host := f.mcpAs(t, "alice")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tools, err := host.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	if got, want := strings.Join(names, ","), "children,delegate,dispose,followup,interrupt,providers,result,state"; got != want {
		t.Errorf("tools %s, want %s", got, want)
	}

	var provs mcpserver.ProvidersOutput
	if msg := call(t, host, nil, "providers", nil, &provs); msg != "" || len(provs.Providers) == 0 || provs.Providers[0].Name != "spawn" {
		t.Fatalf("providers %+v %s", provs, msg)
	}

	t.Run("one-shot answers at once, result waits", func(t *testing.T) {
		st := mustCall(t, host, "delegate", map[string]any{"provider": "spawn", "prompt": "sleep 500ms\nsay done", "waitSeconds": 0})
		if st.Kind != mcpserver.KindOneShot || st.ChildID == "" || st.RunID == "" || st.State != protocol.RunRunning || st.Result != nil {
			t.Fatalf("delegate answered %+v, want a running one-shot's ids", st)
		}
		got := mustCall(t, host, "result", map[string]any{"id": st.ChildID, "waitSeconds": 30})
		if got.State != protocol.RunSettled || got.Result == nil || got.Result.StopReason != "completed" || got.Result.Output != "done" {
			t.Fatalf("result %+v", got)
		}
	})

	t.Run("one-shot with an output schema waits by default", func(t *testing.T) {
		st := mustCall(t, host, "delegate", map[string]any{"provider": "spawn", "prompt": `json {"n": 7}`,
			"outputSchema": map[string]any{"type": "object", "properties": map[string]any{"n": map[string]any{"type": "integer"}}, "required": []string{"n"}}})
		if st.Result == nil || st.Result.StopReason != "completed" {
			t.Fatalf("delegate %+v", st)
		}
		if m, ok := st.Result.Structured.(map[string]any); !ok || m["n"] != float64(7) {
			t.Fatalf("structured %#v", st.Result.Structured)
		}
	})

	t.Run("continuable: followup and dispose", func(t *testing.T) {
		st := mustCall(t, host, "delegate", map[string]any{"provider": "spawn", "prompt": "say first", "continuable": true, "label": "talker"})
		if st.Kind != mcpserver.KindContinuable || st.MessageID == "" || st.Result == nil || st.Result.Output != "first" || st.Result.Turn != 1 {
			t.Fatalf("delegate continuable %+v", st)
		}
		var kids mcpserver.ChildrenOutput
		testutil.Eventually(t, 10*time.Second, func() bool {
			kids = mcpserver.ChildrenOutput{}
			call(t, host, nil, "children", nil, &kids)
			for _, r := range kids.Children {
				if r.ID == st.ChildID {
					return true
				}
			}
			return false
		}, "children lists %s", st.ChildID)
		up := mustCall(t, host, "followup", map[string]any{"childId": st.ChildID, "message": "say second"})
		if up.MessageID == "" || up.Result == nil || up.Result.Output != "second" || up.Result.Turn != 2 {
			t.Fatalf("followup %+v", up)
		}
		state := mustCall(t, host, "state", map[string]any{"id": st.ChildID})
		if state.Kind != mcpserver.KindContinuable || state.ChildID != st.ChildID {
			t.Fatalf("state %+v", state)
		}
		// A followup that runs long: interrupt ends its turn, dispose its activation.
		long := mustCall(t, host, "followup", map[string]any{"childId": st.ChildID, "message": "sleep 60s\nsay never", "waitSeconds": 0})
		if long.Result != nil {
			t.Fatalf("followup without waiting answered a turn: %+v", long)
		}
		testutil.Eventually(t, 10*time.Second, func() bool {
			return mustCall(t, host, "state", map[string]any{"id": st.ChildID}).State == protocol.StateRunning
		}, "the long turn runs")
		gone := mustCall(t, host, "dispose", map[string]any{"id": st.ChildID})
		if len(gone.Disposed) == 0 || gone.Disposed[0] != st.ChildID {
			t.Fatalf("dispose %+v", gone)
		}
		testutil.Eventually(t, 10*time.Second, func() bool {
			return mustCall(t, host, "state", map[string]any{"id": st.ChildID}).State == protocol.StateNone
		}, "the disposed child has no live activation")
	})

	t.Run("dispose a running one-shot", func(t *testing.T) {
		st := mustCall(t, host, "delegate", map[string]any{"provider": "spawn", "prompt": "sleep 60s\nsay never", "waitSeconds": 0})
		gone := mustCall(t, host, "dispose", map[string]any{"id": st.RunID})
		if gone.State != protocol.RunSettled || gone.Result == nil || gone.Result.StopReason != "aborted" {
			t.Fatalf("dispose %+v", gone)
		}
	})

	t.Run("bad input is a tool error with its code", func(t *testing.T) {
		for _, tc := range []struct {
			tool string
			args map[string]any
			want string
		}{
			{"delegate", map[string]any{"provider": "spawn", "prompt": "x", "continuable": true, "outputSchema": map[string]any{"type": "object"}}, "INVALID_ARGUMENT"},
			{"delegate", map[string]any{"provider": "nobody", "prompt": "say x"}, "NO_PROVIDER"},
			{"followup", map[string]any{"childId": "", "message": "x"}, "INVALID_ARGUMENT"},
		} {
			if msg := call(t, host, nil, tc.tool, tc.args, nil); !strings.Contains(msg, tc.want) {
				t.Errorf("%s %v: tool error %q, want %s", tc.tool, tc.args, msg, tc.want)
			}
		}
	})
}

// TestAnotherUsersChildIsRefused: bob's MCP server cannot read, follow up,
// interrupt or dispose alice's children; alice's child is untouched.
func TestAnotherUsersChildIsRefused(t *testing.T) {
	f := newFleet(t)
	alice, bob := f.mcpAs(t, "alice"), f.mcpAs(t, "bob")
	oneShot := mustCall(t, alice, "delegate", map[string]any{"provider": "spawn", "prompt": "say mine"})
	cont := mustCall(t, alice, "delegate", map[string]any{"provider": "spawn", "prompt": "say kept", "continuable": true})
	if oneShot.Result == nil || cont.Result == nil {
		t.Fatalf("alice's children did not answer: %+v %+v", oneShot, cont)
	}
	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{"state", map[string]any{"id": oneShot.ChildID}},
		{"result", map[string]any{"id": oneShot.ChildID, "waitSeconds": 0}},
		{"dispose", map[string]any{"id": oneShot.RunID}},
		{"state", map[string]any{"id": cont.ChildID}},
		{"result", map[string]any{"id": cont.ChildID, "waitSeconds": 0}},
		{"followup", map[string]any{"childId": cont.ChildID, "message": "say stolen", "waitSeconds": 0}},
		{"interrupt", map[string]any{"id": cont.ChildID}},
		{"dispose", map[string]any{"id": cont.ChildID}},
		{"children", map[string]any{"parent": cont.ChildID}},
	} {
		if msg := call(t, bob, nil, tc.tool, tc.args, nil); !strings.Contains(msg, "UNAUTHORIZED") {
			t.Errorf("bob's %s %v: %q, want UNAUTHORIZED", tc.tool, tc.args, msg)
		}
	}
	// Alice's continuable child still answers her, and ran nothing of bob's.
	st := mustCall(t, alice, "result", map[string]any{"id": cont.ChildID, "waitSeconds": 0})
	if st.Result == nil || st.Result.Output != "kept" || st.Result.Turn != 1 {
		t.Fatalf("alice's child after bob tried: %+v", st)
	}
}

// TestHostTraceIsTheParentOfBroodsSpans: the traceparent a host puts in a
// tool call's _meta is the parent of the tool call's span, and the child's
// run joins that trace.
func TestHostTraceIsTheParentOfBroodsSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(telemetry.Propagator())
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
		_ = tp.Shutdown(context.Background())
	})
	f := newFleet(t)
	host := f.mcpAs(t, "alice")

	// The host's own span, in a provider the server does not share.
	hostTP := sdktrace.NewTracerProvider()
	defer func() { _ = hostTP.Shutdown(context.Background()) }()
	hctx, hostSpan := hostTP.Tracer("host").Start(context.Background(), "host turn")
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(hctx, carrier)
	meta := mcp.Meta{"traceparent": carrier["traceparent"]}
	var st mcpserver.Status
	if msg := call(t, host, meta, "delegate", map[string]any{"provider": "spawn", "prompt": "say traced"}, &st); msg != "" || st.Result == nil {
		t.Fatalf("delegate %+v %s", st, msg)
	}
	hostSpan.End()
	want := hostSpan.SpanContext()

	var toolSpan, runSpan sdktrace.ReadOnlySpan
	testutil.Eventually(t, 10*time.Second, func() bool {
		toolSpan, runSpan = nil, nil
		for _, sp := range rec.Ended() {
			if sp.SpanContext().TraceID() != want.TraceID() {
				continue
			}
			switch sp.Name() {
			case "mcp tools/call delegate":
				toolSpan = sp
			case "run spawn":
				runSpan = sp
			}
		}
		return toolSpan != nil && runSpan != nil
	}, "the tool call's and the run's spans ended in the host's trace")
	if toolSpan.Parent().SpanID() != want.SpanID() || toolSpan.SpanKind() != trace.SpanKindServer {
		t.Errorf("tool span's parent %s (%s), want the host's span %s", toolSpan.Parent().SpanID(), toolSpan.SpanKind(), want.SpanID())
	}
	// The run descends from the tool call's span.
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, sp := range rec.Ended() {
		byID[sp.SpanContext().SpanID()] = sp
	}
	found := false
	for sp := runSpan; sp != nil; sp = byID[sp.Parent().SpanID()] {
		if sp.SpanContext().SpanID() == toolSpan.SpanContext().SpanID() {
			found = true
			break
		}
	}
	if !found {
		t.Errorf("the run's span does not descend from the tool call's span")
	}

	// Without a traceparent the tool call starts a trace of its own.
	before := len(rec.Ended())
	if msg := call(t, host, nil, "providers", nil, nil); msg != "" {
		t.Fatal(msg)
	}
	for _, sp := range rec.Ended()[before:] {
		if sp.Name() == "mcp tools/call providers" && sp.SpanContext().TraceID() == want.TraceID() {
			t.Errorf("a call without _meta joined the host's earlier trace")
		}
	}
}
