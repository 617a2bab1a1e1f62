package agent

import (
	"context"
	"encoding/json"
	"errors"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/brood-dev/brood/internal/embedded"
	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/testutil/fuzzcheck"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// schemaAllocBound bounds CheckOutputSchema, compilation included: every
// schema compiles to a validator of about 7 KiB (more deep down) and takes
// at least one input byte (MessagePack's empty map 0x80 as a oneOf branch:
// about 7 KiB per byte measured, 2.4 KiB per byte of JSON's `{},`), so
// 16 KiB per input byte; schemaNodesMax caps the total
// (TestCheckOutputSchemaBoundsItsSchemas).
var schemaAllocBound = fuzzcheck.Bound{Base: 256 << 10, PerByte: 16 << 10}

// FuzzCheckOutputSchema decodes an outputSchema the way the coordinator
// does (protocol.UnmarshalRequest into an untyped value, MessagePack or
// JSON) and holds CheckOutputSchema and the structured_output tool built
// from its answer to their contracts:
//   - a refusal is one UNSUPPORTED_SCHEMA *protocol.Error listing 1 to
//     protocol.OutputSchemaViolationsMax violations (plus a count of the rest), each
//     "<JSON pointer or (root)>: <problem>";
//   - an accepted schema's canonical text is compact JSON with sorted keys
//     and no HTML escaping, checks again to itself, and builds the
//     structured_output tool with it as parameters; a schema accepted from
//     JSON is accepted with the same text from its MessagePack form;
//   - a structured_output call either captures (the turn concludes, the
//     value is its canonical JSON, which captures again to itself and
//     validates against the compiled schema) or is an INVALID_ARGS error
//     result of at most invalidArgsMessagesMax messages;
//   - the check allocates within schemaAllocBound.
func FuzzCheckOutputSchema(f *testing.F) {
	fuzzcheck.SeedsPresent(f, "FuzzCheckOutputSchema", 10)
	f.Fuzz(func(t *testing.T, schema []byte, asMsgpack bool, args string) {
		enc := protocol.JSON
		if asMsgpack {
			enc = protocol.Msgpack
		}
		var v any
		if err := protocol.UnmarshalRequest(enc, schema, &v); err != nil {
			return // refused before any check, as a request would be
		}
		var canonical string
		var err error
		fuzzcheck.AllocWithin(t, "CheckOutputSchema", schemaAllocBound.Of(len(schema)), func() {
			canonical, err = protocol.CheckOutputSchema(v)
		})
		if err != nil {
			checkSchemaRefusal(t, err)
			return
		}
		checkCanonical(t, canonical)
		if !asMsgpack {
			mp, err := protocol.Marshal(protocol.Msgpack, v)
			if err != nil {
				t.Fatalf("an accepted schema does not encode as MessagePack: %v", err)
			}
			var back any
			if err := protocol.UnmarshalRequest(protocol.Msgpack, mp, &back); err != nil {
				t.Fatalf("its MessagePack form is refused: %v", err)
			}
			if c2, err := protocol.CheckOutputSchema(back); err != nil || c2 != canonical {
				t.Fatalf("its MessagePack form checks to %q, %v; JSON gave %q", c2, err, canonical)
			}
		}
		tool, err := StructuredOutputTool(canonical)
		if err != nil {
			t.Fatalf("the canonical text %q of an accepted schema builds no tool: %v", canonical, err)
		}
		if string(tool.Parameters) != canonical {
			t.Fatalf("tool parameters %s, want %s", tool.Parameters, canonical)
		}
		checkCapture(t, tool, canonical, args)
	})
}

func checkSchemaRefusal(t *testing.T, err error) {
	t.Helper()
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeUnsupportedSchema {
		t.Fatalf("refusal %v is not UNSUPPORTED_SCHEMA", err)
	}
	vs, ok := pe.Details["violations"].([]string)
	if !ok || len(vs) == 0 || len(vs) > protocol.OutputSchemaViolationsMax+1 {
		t.Fatalf("violations %#v: want 1 to %d", pe.Details["violations"], protocol.OutputSchemaViolationsMax+1)
	}
	for i, v := range vs {
		path, problem, ok := strings.Cut(v, ": ")
		if i == protocol.OutputSchemaViolationsMax && strings.HasPrefix(v, "and ") {
			continue
		}
		if !ok || problem == "" || (path != "(root)" && !strings.HasPrefix(path, "/")) {
			t.Fatalf("violation %q is not \"<path>: <problem>\"", v)
		}
	}
}

// checkCanonical: compact, sorted keys, no HTML escaping, a fixed point.
func checkCanonical(t *testing.T, canonical string) {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(canonical))
	if err != nil {
		t.Fatalf("canonical text %q is not JSON: %v", canonical, err)
	}
	again, err := protocol.CheckOutputSchema(doc)
	if err != nil || again != canonical {
		t.Fatalf("canonical text %q checks to %q, %v", canonical, again, err)
	}
	d := json.NewDecoder(strings.NewReader(canonical))
	d.UseNumber()
	var plain any
	if err := d.Decode(&plain); err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	e := json.NewEncoder(&buf) // sorts keys, writes compactly, numbers verbatim
	e.SetEscapeHTML(false)
	if err := e.Encode(plain); err != nil {
		t.Fatal(err)
	}
	if sorted := strings.TrimSuffix(buf.String(), "\n"); sorted != canonical {
		t.Fatalf("canonical text %q is not compact with sorted keys (%s)", canonical, sorted)
	}
}

func checkCapture(t *testing.T, tool *Tool, canonical, args string) {
	t.Helper()
	res := tool.Run(context.Background(), ToolContext{}, args)
	text := protocol.PlainText(res.Content)
	if res.IsError {
		if res.Conclude || res.Structured != "" || !strings.HasPrefix(text, "INVALID_ARGS: ") || !strings.Contains(text, "call structured_output again") {
			t.Fatalf("a refused capture: %+v", res)
		}
		return
	}
	if !res.Conclude || res.Structured == "" || text != recordedText {
		t.Fatalf("a capture: %+v", res)
	}
	again := tool.Run(context.Background(), ToolContext{}, res.Structured)
	if again.IsError || again.Structured != res.Structured {
		t.Fatalf("captured %q captures again as %+v", res.Structured, again)
	}
	sch, err := protocol.ParseOutputSchema(canonical)
	if err != nil {
		t.Fatalf("compile %q: %v", canonical, err)
	}
	value, err := jsonschema.UnmarshalJSON(strings.NewReader(res.Structured))
	if err != nil {
		t.Fatalf("captured %q is not JSON: %v", res.Structured, err)
	}
	if problems := sch.Validate(value); len(problems) > 0 {
		t.Fatalf("captured %q does not validate against %s: %v", res.Structured, canonical, problems)
	}
}

// scriptedCalls is a model that answers the first request with one call of
// tool with args and every later one with "done".
type scriptedCalls struct {
	tool, args string
	requests   int
}

func (*scriptedCalls) Provider() string { return "test" }
func (*scriptedCalls) Name() string     { return "calls" }
func (m *scriptedCalls) Stream(_ context.Context, req model.Request, onText func(string)) (model.Response, error) {
	m.requests++
	if m.requests == 1 {
		return model.Response{Message: protocol.AssistantMessage{Content: []protocol.ContentBlock{},
			ToolCalls: []protocol.ToolCall{{ID: "c1", Name: m.tool, Arguments: m.args}}}, Finish: model.FinishToolCalls}, nil
	}
	onText("done")
	return model.Response{Message: protocol.AssistantMessage{Content: protocol.Text("done")}, Finish: model.FinishStop}, nil
}

// fuzzTools are the tools a provider worker offers (internal/worker's
// in-process host: workspace, delegation and continuable-child tools,
// report and structured_output), on a NATS server where no coordinator
// answers, so a call that gets past its arguments fails UNAVAILABLE at once.
func fuzzTools(f *testing.F) (tools []*Tool, cwd string) {
	srv, err := embedded.Start(embedded.Config{Host: "127.0.0.1", Port: -1, DataDir: f.TempDir(), ServerName: "fuzz"})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(nc.Close)
	cl, err := client.New(nc, client.Options{})
	if err != nil {
		f.Fatal(err)
	}
	so, err := StructuredOutputTool(`{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],"additionalProperties":false}`)
	if err != nil {
		f.Fatal(err)
	}
	cwd = f.TempDir()
	if err := os.WriteFile(filepath.Join(cwd, "a.txt"), []byte("hello\n"), 0o644); err != nil {
		f.Fatal(err)
	}
	return []*Tool{ListDirTool(AnyWorkspace), ReadFileTool(AnyWorkspace),
		SubagentTool(SubagentConfig{Client: cl, Provider: "spawn", Background: BackgroundStarter(cl, "spawn")}),
		SendMessageTool(cl), InterruptAgentTool(cl), ListAgentsTool(cl), ReportTool(cl), so}, cwd
}

// jsonObjectText reports whether s is one JSON object with only JSON white
// space (space, tab, CR, LF; RFC 8259 §2) around it.
func jsonObjectText(s string) bool {
	return strings.HasPrefix(strings.TrimLeft(s, " \t\r\n"), "{") && json.Valid([]byte(s))
}

// FuzzToolArguments runs one step of the agent runtime whose model calls a
// tool with arbitrary argument text (issue 14: invalid arguments) and holds
// the path from the model's text to the tool and back to the model:
//   - the log keeps the call's arguments byte for byte;
//   - arguments that are neither blank nor one JSON object never reach the
//     tool: the result is the runtime's isError "<tool>: invalid
//     arguments: …; nothing was run", quoting at most 200 bytes of what was
//     sent on one line (valid UTF-8 stays valid);
//   - arguments that are a JSON object reach the tool, whose own strict
//     decoding agrees they are JSON (no syntax error comes back), and no
//     tool panics;
//   - the next request replays the call's arguments as a JSON object: the
//     text itself when it is one, else {} (strict servers refuse anything
//     else), for ReplayArguments and History alike;
//   - the agent's Index answers what History and the log walks read from
//     the turn's events, at every prefix (checkIndexAtEveryPrefix).
func FuzzToolArguments(f *testing.F) {
	fuzzcheck.SeedsPresent(f, "FuzzToolArguments", 10)
	tools, cwd := fuzzTools(f)
	names := make([]string, len(tools))
	for i, tl := range tools {
		names[i] = tl.Name
	}
	reg, err := NewRegistry(tools...)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name, args string) {
		if !slices.Contains(names, name) { // mutated names still pick a tool
			h := fnv.New32a()
			h.Write([]byte(name))
			name = names[h.Sum32()%uint32(len(names))]
		}
		log := &memLog{}
		a, err := New(Config{Header: protocol.SessionHeader{ID: "S1", Cwd: cwd}, Log: log, Model: &scriptedCalls{tool: name, args: args}, Tools: reg})
		if err != nil {
			t.Fatal(err)
		}
		if out := a.RunTurn(context.Background(), userInput("go")); out.Err != nil || out.Fenced {
			t.Fatalf("turn: %+v", out)
		}
		events := a.Events()
		var call *protocol.ToolCallData
		var result *protocol.ToolResultData
		for _, ev := range events {
			switch ev.Type {
			case protocol.EvToolCall:
				call = new(protocol.ToolCallData)
				if err := ev.Decode(call); err != nil {
					t.Fatal(err)
				}
			case protocol.EvToolResult:
				result = new(protocol.ToolResultData)
				if err := ev.Decode(result); err != nil {
					t.Fatal(err)
				}
			}
		}
		if call == nil || result == nil || call.Name != name || call.Arguments != args {
			t.Fatalf("logged call %+v result %+v; want %s with %q", call, result, name, args)
		}
		checkToolResult(t, name, args, result)
		want := "{}"
		if jsonObjectText(args) {
			want = args
		}
		if got := ReplayArguments(args); got != want {
			t.Fatalf("ReplayArguments(%q) = %q, want %q", args, got, want)
		}
		msgs, err := History(events)
		if err != nil {
			t.Fatal(err)
		}
		checkIndexAtEveryPrefix(t, events)
		for _, m := range msgs {
			for _, c := range m.ToolCalls {
				if c.Arguments != want {
					t.Fatalf("replayed arguments %q, want %q", c.Arguments, want)
				}
			}
		}
	})
}

func checkToolResult(t *testing.T, name, args string, r *protocol.ToolResultData) {
	t.Helper()
	text := protocol.PlainText(r.Content)
	if strings.Contains(text, "failed: internal error") {
		t.Fatalf("%s panicked on %q: %q", name, args, text)
	}
	gate := name + ": invalid arguments: they are not"
	blank := strings.TrimSpace(args) == ""
	if blank || jsonObjectText(args) {
		if strings.HasPrefix(text, gate) {
			t.Fatalf("%s refused %q at the gate: %q", name, args, text)
		}
		// The tool's strict decoder reads what the gate let through:
		// unknown fields and wrong types are its to refuse, syntax is not.
		for _, syntax := range []string{"invalid character", "unexpected end of JSON", "trailing data"} {
			if strings.Contains(text, "invalid arguments: "+syntax) {
				t.Fatalf("%s: the gate passed %q but the tool's decoder refused its syntax: %q", name, args, text)
			}
		}
		return
	}
	if !r.IsError || !strings.HasPrefix(text, gate) || !strings.Contains(text, "nothing was run") {
		t.Fatalf("%s ran with %q (not a JSON object): %q", name, args, text)
	}
	_, rest, _ := strings.Cut(text, "You sent: ")
	quoted, _, ok := strings.Cut(rest, "\nCall "+name+" again")
	if !ok || strings.Contains(quoted, "\n") || len(quoted) > 200+len("…") {
		t.Fatalf("quoted %q: want one line of at most 200 bytes", quoted)
	}
	if utf8.ValidString(args) && !utf8.ValidString(quoted) {
		t.Fatalf("quoting %q made invalid UTF-8: %q", args, quoted)
	}
}
