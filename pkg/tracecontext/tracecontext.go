// Package tracecontext carries OpenTelemetry trace context in NATS message
// headers, so one delegation tree is one trace across processes: a request
// carries the W3C `traceparent` (and `tracestate`, `baggage`) headers of the
// span that sent it, and whoever serves it continues that trace
// (docs/protocol.md, "Trace context"). It uses the global propagator
// (otel.GetTextMapPropagator); Brood's processes set it to W3C trace context
// and baggage. Without an OpenTelemetry SDK configured nothing is recorded,
// but a received context still passes through to the requests a handler
// makes.
package tracecontext

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Carrier adapts a nats.Header to the OpenTelemetry TextMapCarrier. NATS
// header names are case-sensitive: Set writes the name as given (W3C names
// are lowercase); Get finds a name in any case.
type Carrier nats.Header

// Get returns the first value of key, matched in any case.
func (c Carrier) Get(key string) string {
	if v, ok := c[key]; ok && len(v) > 0 {
		return v[0]
	}
	for k, v := range c {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

// Set replaces key's values (any case variant of key is removed first).
func (c Carrier) Set(key, value string) {
	for k := range c {
		if k != key && strings.EqualFold(k, key) {
			delete(c, k)
		}
	}
	c[key] = []string{value}
}

// Keys lists the header names.
func (c Carrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

// Inject writes ctx's trace context into h (h must not be nil).
func Inject(ctx context.Context, h nats.Header) {
	otel.GetTextMapPropagator().Inject(ctx, Carrier(h))
}

// Extract returns ctx with the trace context carried by h (a nil h carries
// none).
func Extract(ctx context.Context, h nats.Header) context.Context {
	if h == nil {
		return ctx
	}
	return otel.GetTextMapPropagator().Extract(ctx, Carrier(h))
}

// W3C trace context header names, as Brood writes them.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// TracerName names the tracer of Brood's spans.
const TracerName = "github.com/brood-dev/brood"

func tracer() trace.Tracer { return otel.Tracer(TracerName) }

// Span attribute keys of requests (OpenTelemetry messaging conventions, and
// Brood's own under brood.*).
const (
	AttrMessagingSystem = "messaging.system"
	AttrDestination     = "messaging.destination.name"
	AttrErrorCode       = "brood.error_code"
)

// SpanName is the name of a request's spans: low-cardinality, from the
// subject after the version token (`<prefix>.v1.<kind>.<rest>`): "coord
// runs.start", "provider spawn.start" (from a provider instance's subject
// `provider.spawn.<hostId>.start`, the host id left out: one token, or the
// two of a worker host id `<scope>.<unique>`), "host dispose" (from
// `host.<hostId>.dispose`, the host id left out); any other subject is
// "nats request".
func SpanName(subject string) string {
	toks := strings.Split(subject, ".")
	for i := 0; i+2 < len(toks); i++ {
		if toks[i] != "v1" {
			continue
		}
		switch kind, rest := toks[i+1], toks[i+2:]; kind {
		case "coord":
			return kind + " " + strings.Join(rest, ".")
		case "provider":
			if len(rest) >= 3 { // <name>.<hostId>.<op>, the host id of one or two tokens
				rest = []string{rest[0], rest[len(rest)-1]}
			}
			return kind + " " + strings.Join(rest, ".")
		case "host":
			if len(rest) >= 2 { // <hostId>.<op>
				return "host " + rest[len(rest)-1]
			}
		}
		break
	}
	return "nats request"
}

// noProvider is the global tracer provider before any is set: its spans
// record nothing and carry their parent's span context.
var noProvider = otel.GetTracerProvider()

// recording reports whether a tracer provider was set (otel.SetTracerProvider:
// telemetry.SetupTracing when spans are exported, or a test's recorder).
// Until then a span records nothing, so StartClient and StartServer build no
// name, attributes or options for one (about 10 µs of CPU per one-shot run
// over its processes, issue 12's profile): the trace context still passes
// through, as the global tracer's span would carry it. OpenTelemetry's
// eBPF auto-instrumentation of that global tracer does not see these spans.
func recording() bool { return otel.GetTracerProvider() != noProvider }

// StartClient starts the client span of a request to subject and injects
// its context into h (must not be nil). End it with End once the reply (or
// the failure) arrived.
func StartClient(ctx context.Context, subject string, h nats.Header) (context.Context, trace.Span) {
	if !recording() {
		Inject(ctx, h)
		return ctx, trace.SpanFromContext(ctx)
	}
	ctx, span := tracer().Start(ctx, SpanName(subject), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String(AttrMessagingSystem, "nats"), attribute.String(AttrDestination, subject)))
	Inject(ctx, h)
	return ctx, span
}

// StartServer continues the trace carried by a request's headers h with the
// server span of its handling. End it with End once answered.
func StartServer(ctx context.Context, subject string, h nats.Header) (context.Context, trace.Span) {
	if !recording() {
		ctx = Extract(ctx, h)
		return ctx, trace.SpanFromContext(ctx)
	}
	return tracer().Start(Extract(ctx, h), SpanName(subject), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String(AttrMessagingSystem, "nats"), attribute.String(AttrDestination, subject)))
}

// End ends span; a non-nil err marks it failed with its catalogue code.
func End(span trace.Span, err error) {
	if err != nil {
		pe := protocol.AsError(err)
		span.SetAttributes(attribute.String(AttrErrorCode, string(pe.Code)))
		span.SetStatus(codes.Error, pe.Error())
	}
	span.End()
}

// MetaCarrier adapts the `_meta` object of an ACP (JSON-RPC) request to the
// OpenTelemetry TextMapCarrier: the W3C keys (`traceparent`, `tracestate`,
// `baggage`) are root keys of `_meta`, where ACP reserves them for trace
// context (its extensibility rules, as MCP's). Get ignores a value that is
// not a string.
type MetaCarrier map[string]any

// Get returns key's value when it is a string.
func (c MetaCarrier) Get(key string) string {
	s, _ := c[key].(string)
	return s
}

// Set sets key.
func (c MetaCarrier) Set(key, value string) { c[key] = value }

// Keys lists the keys.
func (c MetaCarrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

// InjectMeta adds ctx's trace context to the `_meta` of an ACP request
// (MetaCarrier) and returns it: meta itself, or a new map when meta is nil
// and ctx carries a context (nil when it carries none). This is how a
// delegation tree's trace continues through an ACP stdio hop
// (docs/protocol.md, "Trace context").
func InjectMeta(ctx context.Context, meta map[string]any) map[string]any {
	c := MetaCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, c)
	if len(c) == 0 {
		return meta
	}
	if meta == nil {
		meta = make(map[string]any, len(c))
	}
	for k, v := range c {
		meta[k] = v
	}
	return meta
}

// ExtractMeta returns ctx with the trace context an ACP request's `_meta`
// carries (none: ctx as it is).
func ExtractMeta(ctx context.Context, meta map[string]any) context.Context {
	if len(meta) == 0 {
		return ctx
	}
	return otel.GetTextMapPropagator().Extract(ctx, MetaCarrier(meta))
}
