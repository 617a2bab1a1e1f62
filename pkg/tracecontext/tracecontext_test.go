package tracecontext

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

func TestSpanName(t *testing.T) {
	for _, tt := range []struct{ subject, want string }{
		{"brood.v1.coord.runs.start", "coord runs.start"},
		{"acme.v1.coord.continuable.followup", "coord continuable.followup"},
		{"brood.v1.provider.spawn.start", "provider spawn.start"},
		{"brood.v1.provider.spawn.01HOSTID.start", "provider spawn.start"},
		{"brood.v1.provider.spawn.spawn.01HOSTID.start", "provider spawn.start"},
		{"brood.v1.provider.acp.shared.01HOSTID.activate", "provider acp.activate"},
		{"brood.v1.host.01HOSTID.dispose", "host dispose"},
		{"brood.v1.host.spawn.01HOSTID.interrupt", "host interrupt"},
		{"brood.v1.host.01HOSTID", "nats request"},
		{"_INBOX.abc.brood.x", "nats request"},
		{"", "nats request"},
	} {
		if got := SpanName(tt.subject); got != tt.want {
			t.Errorf("SpanName(%q) = %q, want %q", tt.subject, got, tt.want)
		}
	}
}

// NATS header names are case-sensitive: the W3C names are written as the
// spec spells them, and read in any case (a client in another language may
// capitalize them).
func TestCarrierCase(t *testing.T) {
	h := nats.Header{"Traceparent": {"x"}}
	c := Carrier(h)
	if c.Get("traceparent") != "x" {
		t.Fatal("Get does not find a capitalized name")
	}
	c.Set("traceparent", "y")
	if len(h) != 1 || h["traceparent"][0] != "y" {
		t.Fatalf("Set left %v", h)
	}
}

func TestInjectExtractRoundTrip(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	defer otel.SetTextMapPropagator(prev)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled,
	})
	h := nats.Header{}
	Inject(trace.ContextWithSpanContext(context.Background(), sc), h)
	if got := h.Get("traceparent"); got != "00-01020300000000000000000000000000-0405060000000000-01" {
		t.Fatalf("traceparent = %q (header %v)", got, h)
	}
	got := trace.SpanContextFromContext(Extract(context.Background(), h))
	if got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() || !got.IsRemote() {
		t.Fatalf("extracted %+v", got)
	}
	if Extract(context.Background(), nil) == nil {
		t.Fatal("nil header")
	}
}

// TestWithoutATracerProviderNoSpanIsBuilt: until a tracer provider is set
// (none is, in this package's tests) a request's spans build nothing (no
// name, attributes or options: no allocation), and the trace context a
// request carries still passes on to the requests its handler makes, as
// the global tracer's non-recording span would carry it.
func TestWithoutATracerProviderNoSpanIsBuilt(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{}) // as Brood's processes set it
	defer otel.SetTextMapPropagator(prev)
	const parent = "00-01020300000000000000000000000000-0405060000000000-01"
	ctx, span := StartServer(context.Background(), "brood.v1.coord.runs.start", nats.Header{"traceparent": {parent}})
	End(span, nil)
	out := nats.Header{}
	_, cspan := StartClient(ctx, "brood.v1.provider.spawn.H1.start", out)
	End(cspan, nil)
	if got := out.Get("traceparent"); got != parent {
		t.Fatalf("the handler's request carries traceparent %q; want the caller's %q", got, parent)
	}
	allocs := testing.AllocsPerRun(100, func() {
		_, span := StartServer(context.Background(), "brood.v1.coord.continuable.followup", nil)
		End(span, nil)
	})
	if allocs != 0 {
		t.Fatalf("a request's server span allocated %.0f times with no tracer provider; want none", allocs)
	}
}
