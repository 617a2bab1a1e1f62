package acpagent

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/pkg/tracecontext"
)

// startSpan starts the server span of an ACP request's handling (method,
// on session; "acp session/prompt"), continuing the trace its `_meta`
// carries (tracecontext.ExtractMeta: the ACP bridge puts the W3C
// `traceparent` of the child's turn there). So the delegation tree's trace
// goes on through the ACP stdio hop: this agent's turn and every request
// it makes (to the coordinators, for its own children) join it (issue 37,
// item 7). End it with tracecontext.End.
func startSpan(ctx context.Context, method string, meta map[string]any, session string) (context.Context, trace.Span) {
	ctx = tracecontext.ExtractMeta(ctx, meta)
	return telemetry.Tracer().Start(ctx, "acp "+method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String(telemetry.AttrSession, session)))
}
