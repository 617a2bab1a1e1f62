package telemetry

import (
	"context"
	"errors"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/brood-dev/brood/internal/buildinfo"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/tracecontext"
)

// Tracer is the tracer of Brood's spans (the global tracer provider's: a
// no-op until SetupTracing, or a test, installs one).
func Tracer() trace.Tracer { return otel.Tracer(tracecontext.TracerName) }

// Propagator is the one every Brood process uses: W3C trace context and
// baggage, in NATS headers (pkg/tracecontext).
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// SetupTracing configures the process's tracing from the standard
// OpenTelemetry environment variables; export is off unless they ask for it:
//
//   - the propagator is always W3C trace context and baggage, so a process
//     that exports nothing still passes the trace context it receives on to
//     the requests it makes;
//   - OTEL_SDK_DISABLED=true turns export off;
//   - OTEL_TRACES_EXPORTER selects the exporter: otlp, console (spans as
//     JSON on stderr) or none; unset, it is otlp when
//     OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is
//     set, else none;
//   - OTEL_EXPORTER_OTLP_TRACES_PROTOCOL (else OTEL_EXPORTER_OTLP_PROTOCOL)
//     is http/protobuf (the default) or grpc; the exporters read the
//     endpoint, headers, timeout, certificates and compression variables
//     themselves;
//   - OTEL_SERVICE_NAME (else service) and OTEL_RESOURCE_ATTRIBUTES describe
//     the process; OTEL_TRACES_SAMPLER(_ARG) and OTEL_BSP_* are the SDK's.
//
// It returns whether spans are exported and the func that flushes and stops
// the exporter (a no-op when off). A variable with a value it does not
// know is an INVALID_ARGUMENT error naming it.
func SetupTracing(ctx context.Context, service string) (enabled bool, shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(Propagator())
	noop := func(context.Context) error { return nil }
	exp, err := exporterFromEnv(ctx, os.Getenv)
	if err != nil || exp == nil {
		return false, noop, err
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service), semconv.ServiceVersion(buildinfo.Version)),
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost(), resource.WithProcessPID())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		_ = exp.Shutdown(ctx)
		return false, noop, protocol.Errorf(protocol.CodeInvalidArgument, "OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return true, tp.Shutdown, nil
}

// exporterFromEnv builds the exporter the environment asks for, or nil.
func exporterFromEnv(ctx context.Context, getenv func(string) string) (sdktrace.SpanExporter, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, nil
	}
	kind := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")))
	if kind == "" {
		if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, nil // off by default
		}
		kind = "otlp"
	}
	switch kind {
	case "none":
		return nil, nil
	case "console":
		return stdouttrace.New(stdouttrace.WithWriter(os.Stderr))
	case "otlp":
	default:
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "OTEL_TRACES_EXPORTER=%q: Brood exports traces with otlp, console or none", kind)
	}
	proto := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch strings.ToLower(strings.TrimSpace(proto)) {
	case "", "http/protobuf":
		return otlptracehttp.New(ctx)
	case "grpc":
		return otlptracegrpc.New(ctx)
	default:
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "OTLP protocol %q: Brood exports traces over http/protobuf or grpc", proto)
	}
}

// Span attribute keys of Brood's own spans.
const (
	AttrSession    = "brood.session.id"
	AttrParent     = "brood.parent.session.id"
	AttrRun        = "brood.run.id"
	AttrProvider   = "brood.provider"
	AttrMode       = "brood.mode"
	AttrTurn       = "brood.turn"
	AttrStopReason = "brood.stop_reason"
	AttrTool       = "brood.tool.name"
	AttrToolCall   = "brood.tool.call_id"
)

// StartRun starts the span of a hosted run (one-shot) or epoch
// (continuable) as a child of the span in ctx (the provider request's), and
// returns a context that carries only that span, for the run's own work
// (the run outlives the request; its cancellation is its own).
func StartRun(ctx context.Context, provider, mode, runID string, h protocol.SessionHeader) (context.Context, trace.Span) {
	_, span := Tracer().Start(ctx, "run "+provider, trace.WithAttributes(
		attribute.String(AttrProvider, provider), attribute.String(AttrMode, mode), attribute.String(AttrRun, runID),
		attribute.String(AttrSession, h.ID), attribute.String(AttrParent, h.ParentSession),
		attribute.Int64("brood.delegation_depth", h.DelegationDepth)))
	return trace.ContextWithSpan(context.Background(), span), span
}

// EndRun ends a run's or epoch's span with its result (nil: it published
// nothing, its lease lost) or the error that kept it from starting.
func EndRun(span trace.Span, res *protocol.SubagentResult, err error) {
	switch {
	case err != nil:
		pe := protocol.AsError(err)
		span.SetAttributes(attribute.String(tracecontext.AttrErrorCode, string(pe.Code)))
		span.SetStatus(codes.Error, pe.Error())
	case res == nil:
		span.SetStatus(codes.Error, "the session's lease was lost; nothing was published")
	default:
		span.SetAttributes(attribute.String(AttrStopReason, string(res.StopReason)))
		if res.ErrorCode != "" {
			span.SetAttributes(attribute.String(tracecontext.AttrErrorCode, string(res.ErrorCode)))
		}
		if res.StopReason == protocol.StopError {
			span.SetStatus(codes.Error, res.Diagnostic)
		}
	}
	span.End()
}

// StartTurn starts the span of one turn of a continuable child's epoch (a
// one-shot run's turn is its run span). The turn continues the trace of the
// request that accepted its message (item: the inbox item's trace context,
// a followup's or the start's), linked to its epoch's span in ctx; without
// one it is a child of the epoch's span.
func StartTurn(ctx context.Context, turn int64, item map[string][]string) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithAttributes(attribute.Int64(AttrTurn, turn))}
	if from := trace.SpanContextFromContext(tracecontext.Extract(context.Background(), item)); from.IsValid() {
		opts = append(opts, trace.WithLinks(trace.LinkFromContext(ctx, attribute.String("brood.link", "epoch"))))
		ctx = trace.ContextWithRemoteSpanContext(ctx, from)
	}
	return Tracer().Start(ctx, "turn", opts...)
}

// EndTurn ends a turn's span with how the turn ended; err is a log append
// JetStream did not acknowledge.
func EndTurn(span trace.Span, reason protocol.TurnEndReason, err error) {
	span.SetAttributes(attribute.String("brood.turn.end", string(reason.Kind)))
	if reason.Cause != "" {
		span.SetAttributes(attribute.String("brood.turn.cause", reason.Cause))
	}
	switch {
	case err != nil:
		span.SetStatus(codes.Error, err.Error())
	case reason.Kind == protocol.TurnError:
		span.SetStatus(codes.Error, reason.Error)
	}
	span.End()
}

// OpenTelemetry GenAI attribute keys of model call spans.
const (
	AttrGenAISystem       = "gen_ai.system"
	AttrGenAIOperation    = "gen_ai.operation.name"
	AttrGenAIModel        = "gen_ai.request.model"
	AttrGenAIInputTokens  = "gen_ai.usage.input_tokens"
	AttrGenAIOutputTokens = "gen_ai.usage.output_tokens"
	AttrGenAIFinish       = "gen_ai.response.finish_reasons"
)

// StartModel starts the span of one model call ("chat <model>", a client
// span: the call leaves the process).
func StartModel(ctx context.Context, adapter, model string) (context.Context, trace.Span) {
	return Tracer().Start(ctx, "chat "+model, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String(AttrGenAISystem, adapter), attribute.String(AttrGenAIOperation, "chat"), attribute.String(AttrGenAIModel, model)))
}

// EndModel ends a model call's span with its finish, usage (nil: none
// reported) and failure.
func EndModel(span trace.Span, finish string, usage *protocol.Usage, err error) {
	if finish != "" {
		span.SetAttributes(attribute.StringSlice(AttrGenAIFinish, []string{finish}))
	}
	if usage != nil {
		span.SetAttributes(attribute.Int64(AttrGenAIInputTokens, usage.InputTokens), attribute.Int64(AttrGenAIOutputTokens, usage.OutputTokens))
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// StartTool starts the span of one tool call ("tool <name>").
func StartTool(ctx context.Context, name, callID string) (context.Context, trace.Span) {
	return Tracer().Start(ctx, "tool "+name, trace.WithAttributes(attribute.String(AttrTool, name), attribute.String(AttrToolCall, callID)))
}

// EndTool ends a tool call's span; a failed call (an isError result) is
// marked with its headline.
func EndTool(span trace.Span, isError bool, headline string) {
	if isError {
		span.SetStatus(codes.Error, headline)
	}
	span.End()
}
