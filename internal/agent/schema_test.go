package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/protocol"
)

// answerSchema is an output schema of one required integer.
const answerSchema = `{"type":"object","properties":{"answer":{"type":"integer"}},"required":["answer"],"additionalProperties":false}`

// The tool is structured_output, its parameters the schema's canonical text.
func TestStructuredOutputToolParameters(t *testing.T) {
	canonical, err := protocol.CheckOutputSchema(map[string]any{"type": "object", "properties": map[string]any{"b": map[string]any{"type": "string"}, "a": map[string]any{"type": "integer"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, schema := range []string{canonical, `{ "type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}} }`} {
		tool, err := StructuredOutputTool(schema)
		if err != nil {
			t.Fatalf("tool: %v", err)
		}
		if string(tool.Parameters) != canonical || tool.Name != model.StructuredOutputTool {
			t.Fatalf("tool = %s %s, want %s %s", tool.Name, tool.Parameters, model.StructuredOutputTool, canonical)
		}
	}
}

func TestStructuredOutputToolValidates(t *testing.T) {
	tool, err := StructuredOutputTool(answerSchema)
	if err != nil {
		t.Fatal(err)
	}
	numberTool, err := StructuredOutputTool(`{"type":"object","properties":{"x":{"type":"number"},"s":{"type":"string"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		tool       *Tool
		args       string
		structured string   // want a capture of this canonical JSON
		invalid    []string // else an INVALID_ARGS result containing these
	}{
		{"valid", tool, `{"answer":42}`, `{"answer":42}`, nil},
		{"valid with spaces", tool, ` { "answer" : -7 } `, `{"answer":-7}`, nil},
		{"2^53+1 exact", tool, `{"answer":9007199254740993}`, `{"answer":9007199254740993}`, nil},
		{"max int64 exact", tool, `{"answer":9223372036854775807}`, `{"answer":9223372036854775807}`, nil},
		{"beyond int64 exact", tool, `{"answer":18446744073709551617}`, `{"answer":18446744073709551617}`, nil},
		{"sorted keys, no HTML escaping", numberTool, `{"s":"<a> & b","x":1.5}`, `{"s":"<a> & b","x":1.5}`, nil},
		{"wrong type", tool, `{"answer":"x"}`, "", []string{"/answer", "want integer"}},
		{"not integral", tool, `{"answer":4.2}`, "", []string{"/answer"}},
		{"missing", tool, `{}`, "", []string{"(root)", "answer"}},
		{"extra property", tool, `{"answer":1,"more":2}`, "", []string{"more"}},
		{"not JSON", tool, `{"answer":`, "", []string{"not one JSON value"}},
		{"trailing data", tool, `{"answer":1} {}`, "", []string{"not one JSON value"}},
		{"empty", tool, ``, "", []string{"not one JSON value"}},
		{"not an object", tool, `[42]`, "", []string{"want object"}},
		{"number beyond double", numberTool, `{"x":1e400}`, "", []string{"/x: 1e400 is out of the range of a double"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.tool.Run(context.Background(), ToolContext{}, tt.args)
			text := protocol.PlainText(r.Content)
			if tt.invalid == nil {
				if r.IsError || !r.Conclude || text != `{"recorded":true}` || r.Structured != tt.structured {
					t.Fatalf("result = %+v (%q), want capture %s", r, text, tt.structured)
				}
				return
			}
			if !r.IsError || r.Conclude || r.Structured != "" || !strings.HasPrefix(text, "INVALID_ARGS: ") {
				t.Fatalf("result = %+v (%q), want INVALID_ARGS", r, text)
			}
			for _, s := range tt.invalid {
				if !strings.Contains(text, s) {
					t.Fatalf("%q does not contain %q", text, s)
				}
			}
		})
	}
}

func TestStructuredOutputToolRejectsBadSchemas(t *testing.T) {
	for _, s := range []string{``, `{`, `{"type":"object"} x`, `{"type":"string"}`, `{"type":"object","properties":{"a":{"$ref":"#"}}}`} {
		if _, err := StructuredOutputTool(s); !errors.Is(err, protocol.ErrUnsupportedSchema) {
			t.Errorf("StructuredOutputTool(%q) = %v, want UNSUPPORTED_SCHEMA", s, err)
		}
	}
}

func TestStructuredOutputToolCapsMessages(t *testing.T) {
	props := map[string]any{}
	var req []any
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"} {
		props[k] = map[string]any{"type": "string"}
		req = append(req, k)
	}
	canonical, err := protocol.CheckOutputSchema(map[string]any{"type": "object", "properties": props, "required": req})
	if err != nil {
		t.Fatal(err)
	}
	tool, err := StructuredOutputTool(canonical)
	if err != nil {
		t.Fatal(err)
	}
	r := tool.Run(context.Background(), ToolContext{}, `{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10}`)
	if text := protocol.PlainText(r.Content); !r.IsError || !strings.Contains(text, "and 2 more") {
		t.Fatalf("result = %q", text)
	}
}

// newStructuredAgent builds an agent whose registry holds list_dir and the
// structured_output tool for schema, added as a child-local tool.
func newStructuredAgent(t *testing.T, schema string) *Agent {
	t.Helper()
	tool, err := StructuredOutputTool(schema)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := NewRegistry(ListDirTool(AnyWorkspace))
	if err != nil {
		t.Fatal(err)
	}
	reg = reg.WithLocal(tool)
	a, err := New(Config{
		Header: protocol.SessionHeader{ID: "S1", Cwd: t.TempDir()}, Log: &memLog{}, Model: model.NewScripted(),
		Tools: reg, System: StructuredOutputInstruction,
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestStructuredCaptureThroughTheRuntime(t *testing.T) {
	tests := []struct {
		name       string
		script     string
		stop       protocol.StopReason
		structured any
	}{
		{"capture", `json {"answer":42}`, protocol.StopCompleted, map[string]any{"answer": int64(42)}},
		{"retry after INVALID_ARGS", "json {\"answer\":\"x\"}\njson {\"answer\":7}", protocol.StopCompleted, map[string]any{"answer": int64(7)}},
		{"2^53+1", `json {"answer":9007199254740993}`, protocol.StopCompleted, map[string]any{"answer": int64(9007199254740993)}},
		{"max int64", `json {"answer":9223372036854775807}`, protocol.StopCompleted, map[string]any{"answer": int64(math.MaxInt64)}},
		{"invalid then nothing", `json {"answer":"x"}`, protocol.StopError, nil},
		{"no capture", `say no capture`, protocol.StopError, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newStructuredAgent(t, answerSchema)
			out := a.RunTurn(context.Background(), userInput(tt.script))
			if out.Err != nil || out.Fenced || out.Reason.Kind != protocol.TurnCompleted {
				t.Fatalf("outcome = %+v", out)
			}
			r := sessionlog.OneShotOutcome(a.Events(), false, true)
			if r.StopReason != tt.stop || !reflect.DeepEqual(r.Structured, tt.structured) {
				t.Fatalf("result = %+v (structured %#v), want %s %#v", r, r.Structured, tt.stop, tt.structured)
			}
			if tt.stop == protocol.StopError && !strings.Contains(r.Diagnostic, "structured_output") {
				t.Fatalf("diagnostic = %q", r.Diagnostic)
			}
		})
	}
}

func TestInvalidCaptureIsAnErrorResultInTheLog(t *testing.T) {
	a := newStructuredAgent(t, answerSchema)
	a.RunTurn(context.Background(), userInput(`json {"answer":"x"}`))
	found := false
	for _, ev := range a.Events() {
		if ev.Type != protocol.EvToolResult {
			continue
		}
		var d protocol.ToolResultData
		if err := ev.Decode(&d); err != nil {
			t.Fatal(err)
		}
		found = true
		if d.Name != model.StructuredOutputTool || !d.IsError || !strings.HasPrefix(protocol.PlainText(d.Content), "INVALID_ARGS: ") {
			t.Fatalf("tool result = %+v", d)
		}
	}
	if !found {
		t.Fatal("no tool result logged")
	}
}

func ExampleStructuredOutputTool() {
	tool, _ := StructuredOutputTool(`{"type":"object","properties":{"answer":{"type":"integer"}},"required":["answer"]}`)
	for _, args := range []string{`{"answer":"x"}`, `{"answer":9007199254740993}`} {
		r := tool.Run(context.Background(), ToolContext{}, args)
		fmt.Println(r.IsError, r.Conclude, protocol.PlainText(r.Content))
		if r.Structured != "" {
			fmt.Println("captured", r.Structured)
		}
	}
	// Output:
	// true false INVALID_ARGS: /answer: got string, want integer; fix the value and call structured_output again
	// false true {"recorded":true}
	// captured {"answer":9007199254740993}
}
