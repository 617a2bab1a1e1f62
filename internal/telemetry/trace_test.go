package telemetry

import (
	"context"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Export is off unless the standard variables ask for it.
func TestExporterFromEnv(t *testing.T) {
	for _, tt := range []struct {
		name string
		env  map[string]string
		want string // "", "otlp", "console"; error: "INVALID_ARGUMENT"
	}{
		{"nothing set: off", nil, ""},
		{"endpoint: otlp over http", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, "otlp"},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, "otlp"},
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "otlp"},
		{"traces protocol wins", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "bogus", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, "otlp"},
		{"exporter none beats an endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, ""},
		{"sdk disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, ""},
		{"console", map[string]string{"OTEL_TRACES_EXPORTER": "console"}, "console"},
		{"unknown exporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, "INVALID_ARGUMENT"},
		{"unknown protocol", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "INVALID_ARGUMENT"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			exp, err := exporterFromEnv(context.Background(), func(k string) string { return tt.env[k] })
			got := ""
			switch e := exp.(type) {
			case nil:
			case *otlptrace.Exporter:
				got = "otlp"
			case *stdouttrace.Exporter:
				got = "console"
			default:
				got = fmt.Sprintf("%T", e)
			}
			if err != nil {
				got = string(protocol.CodeOf(err))
			}
			if exp != nil {
				_ = exp.Shutdown(context.Background())
			}
			if got != tt.want {
				t.Fatalf("got %q (%v), want %q", got, err, tt.want)
			}
		})
	}
}
