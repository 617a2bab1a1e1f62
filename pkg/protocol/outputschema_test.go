package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/brood-dev/brood/internal/testutil/fuzzcheck"
)

// decodeSchema decodes schema text the way the wire does (protocol numbers).
func decodeSchema(t *testing.T, text string) any {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	v = NormalizeNumbers(v)
	if err != nil {
		t.Fatalf("bad test schema %s: %v", text, err)
	}
	return v
}

// violations returns the UNSUPPORTED_SCHEMA violations of err.
func violations(t *testing.T, err error) []string {
	t.Helper()
	var pe *Error
	if !errors.As(err, &pe) || !errors.Is(err, ErrUnsupportedSchema) {
		t.Fatalf("error = %v, want UNSUPPORTED_SCHEMA", err)
	}
	v, ok := pe.Details["violations"].([]string)
	if !ok || len(v) == 0 {
		t.Fatalf("details = %#v, want violations", pe.Details)
	}
	for _, s := range v {
		if !strings.Contains(pe.Message, s) {
			t.Fatalf("message %q does not mention violation %q", pe.Message, s)
		}
	}
	return v
}

// violationPaths returns the sorted paths of violations.
func violationPaths(vs []string) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i], _, _ = strings.Cut(v, ": ")
	}
	sort.Strings(out)
	return out
}

func TestCheckOutputSchemaAccepts(t *testing.T) {
	tests := []struct {
		name, schema string
	}{
		{"empty object", `{"type":"object"}`},
		{"nested objects", `{"type":"object","properties":{"a":{"type":"object","properties":{"b":{"type":"string"}},"required":["b"],"additionalProperties":false}},"required":["a"],"additionalProperties":true}`},
		{"arrays", `{"type":"object","properties":{"xs":{"type":"array","items":{"type":"array","items":{"type":"integer"}}},"ys":{"type":"array"}}}`},
		{"oneOf", `{"type":"object","properties":{"v":{"oneOf":[{"type":"string"},{"type":"null"},{"type":"object","properties":{"k":{"type":"boolean"}}}]}}}`},
		{"enum and const", `{"type":"object","properties":{
			"s":{"type":"string","enum":["a","b"],"const":"a"},
			"i":{"type":"integer","enum":[1,2.0,3e2],"const":2},
			"n":{"type":"number","enum":[1.5,-2],"const":-2.0},
			"b":{"type":"boolean","const":true},
			"z":{"type":"null","enum":[null]},
			"big":{"type":"integer","enum":[18446744073709551615,9007199254740993]}}}`},
		{"annotations", `{"type":"object","title":"T","description":"D","default":{"a":[1,null]},"examples":[{"a":1}],
			"properties":{"a":{"type":"number","title":"","default":1.25,"examples":[1,2]}}}`},
		{"annotation-only nodes", `{"type":"object","properties":{"any":{"description":"anything at all"},"empty":{},"list":{"type":"array","items":{"title":"x"}}}}`},
		{"odd property names", `{"type":"object","properties":{"a/b":{"type":"string"},"~":{"type":"string"},"":{"type":"string"},"type":{"type":"string"}},"required":["a/b","","type"]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			canonical, err := CheckOutputSchema(decodeSchema(t, tt.schema))
			if err != nil {
				t.Fatalf("rejected: %v", err)
			}
			if !json.Valid([]byte(canonical)) || strings.ContainsAny(canonical, "\n\t") {
				t.Fatalf("canonical is not compact JSON: %s", canonical)
			}
			// Canonical text is a fixed point and compiles (the
			// structured_output tool's schema, internal/agent).
			again, err := CheckOutputSchema(decodeSchema(t, canonical))
			if err != nil || again != canonical {
				t.Fatalf("canonical not stable: %s then %s (%v)", canonical, again, err)
			}
			sch, err := ParseOutputSchema(canonical)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if sch.Canonical() != canonical {
				t.Fatalf("parsed schema = %s", sch.Canonical())
			}
		})
	}
}

func TestCheckOutputSchemaCanonicalText(t *testing.T) {
	got, err := CheckOutputSchema(decodeSchema(t, `{ "type" : "object", "properties": {"b": {"type":"string","description":"<b> & co"}, "a": {"type":"integer","enum":[9223372036854775807]}} }`))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"properties":{"a":{"enum":[9223372036854775807],"type":"integer"},"b":{"description":"<b> & co","type":"string"}},"type":"object"}`
	if got != want {
		t.Fatalf("canonical = %s\nwant        %s", got, want)
	}
}

func TestCheckOutputSchemaRejects(t *testing.T) {
	obj := func(props string) string { return `{"type":"object","properties":{` + props + `}}` }
	tests := []struct {
		name, schema string
		paths        []string
		contains     string // in the first violation
	}{
		{"root not object", `{"type":"string"}`, []string{"(root)"}, `root schema must have type "object"`},
		{"root without type", `{"properties":{}}`, []string{"(root)", "/properties"}, `root schema`},
		{"root annotation-only", `{}`, []string{"(root)"}, `root schema`},
		{"root oneOf", `{"oneOf":[{"type":"object"},{"type":"null"}]}`, []string{"(root)"}, `root schema`},
		{"root array", `[]`, []string{"(root)"}, `must be a JSON object, not an array`},
		{"type array", obj(`"a":{"type":["string","null"]}`), []string{"/properties/a/type"}, "type arrays are not supported"},
		{"unknown type", obj(`"a":{"type":"float"}`), []string{"/properties/a/type"}, `unknown type "float"`},
		{"type not string", obj(`"a":{"type":3}`), []string{"/properties/a/type"}, "type must be a string"},
		{"unknown keyword", obj(`"a":{"type":"string","format":"email"}`), []string{"/properties/a/format"}, `unknown keyword "format"`},
		{"ref", obj(`"a":{"$ref":"#"}`), []string{"/properties/a/$ref"}, `unknown keyword "$ref"`},
		{"schema node not object", obj(`"a":true`), []string{"/properties/a"}, "must be a JSON object, not a boolean"},
		{"type and oneOf", obj(`"a":{"type":"string","oneOf":[{"type":"string"},{"type":"null"}]}`), []string{"/properties/a"}, "either type or oneOf"},
		{"structural without type", obj(`"a":{"properties":{},"enum":[1]}`), []string{"/properties/a/enum", "/properties/a/properties"}, "needs a type"},
		{"oneOf one branch", obj(`"a":{"oneOf":[{"type":"string"}]}`), []string{"/properties/a/oneOf"}, "at least 2 branches, got 1"},
		{"oneOf not array", obj(`"a":{"oneOf":{"type":"string"}}`), []string{"/properties/a/oneOf"}, "oneOf must be an array"},
		{"oneOf sibling", obj(`"a":{"oneOf":[{"type":"string"},{"type":"null"}],"enum":["x"]}`), []string{"/properties/a/enum"}, "not allowed next to oneOf"},
		{"oneOf bad branch", obj(`"a":{"oneOf":[{"type":"string"},{"type":"bogus"}]}`), []string{"/properties/a/oneOf/1/type"}, "unknown type"},
		{"properties on string", obj(`"a":{"type":"string","properties":{}}`), []string{"/properties/a/properties"}, `only allowed on type "object"`},
		{"required on array", obj(`"a":{"type":"array","required":[]}`), []string{"/properties/a/required"}, `only allowed on type "object"`},
		{"additionalProperties on null", obj(`"a":{"type":"null","additionalProperties":false}`), []string{"/properties/a/additionalProperties"}, `only allowed on type "object"`},
		{"items on object", obj(`"a":{"type":"object","items":{}}`), []string{"/properties/a/items"}, `only allowed on type "array"`},
		{"enum on object", obj(`"a":{"type":"object","enum":[{}]}`), []string{"/properties/a/enum"}, "only allowed on scalar types"},
		{"const on array", obj(`"a":{"type":"array","const":[]}`), []string{"/properties/a/const"}, "only allowed on scalar types"},
		{"required undeclared", `{"type":"object","properties":{"a":{}},"required":["a","b"]}`, []string{"/required/1"}, `"b" is not a declared property`},
		{"required without properties", `{"type":"object","required":["a"]}`, []string{"/required/0"}, "not a declared property"},
		{"required twice", `{"type":"object","properties":{"a":{}},"required":["a","a"]}`, []string{"/required/1"}, "listed twice"},
		{"required not strings", `{"type":"object","properties":{"a":{}},"required":[1]}`, []string{"/required/0"}, "must be a string"},
		{"required not array", `{"type":"object","required":"a"}`, []string{"/required"}, "must be an array"},
		{"additionalProperties schema", `{"type":"object","additionalProperties":{"type":"string"}}`, []string{"/additionalProperties"}, "must be a boolean"},
		{"properties not object", `{"type":"object","properties":[]}`, []string{"/properties"}, "properties must be an object"},
		{"enum empty", obj(`"a":{"type":"string","enum":[]}`), []string{"/properties/a/enum"}, "must not be empty"},
		{"enum not array", obj(`"a":{"type":"string","enum":"x"}`), []string{"/properties/a/enum"}, "enum must be an array"},
		{"enum wrong type", obj(`"a":{"type":"string","enum":["x",1,null]}`), []string{"/properties/a/enum/1", "/properties/a/enum/2"}, `does not match type "string"`},
		{"integer enum not integral", obj(`"a":{"type":"integer","enum":[1,2.5]}`), []string{"/properties/a/enum/1"}, "2.5 is not an integer"},
		{"integer const not integral", obj(`"a":{"type":"integer","const":0.1}`), []string{"/properties/a/const"}, "not an integer"},
		{"const wrong type", obj(`"a":{"type":"boolean","const":"true"}`), []string{"/properties/a/const"}, `does not match type "boolean"`},
		{"const not in enum", obj(`"a":{"type":"number","enum":[1,2],"const":3}`), []string{"/properties/a/const"}, "not one of the enum values"},
		{"negative zero literal", obj(`"a":{"type":"number","enum":[-0.0]}`), []string{"/properties/a/enum/0"}, "-0 is not allowed"},
		{"number out of range", obj(`"a":{"type":"number","default":1e400}`), []string{"/properties/a/default"}, "NaN"},
		{"description not string", `{"type":"object","description":7}`, []string{"/description"}, "description must be a string"},
		{"title not string", `{"type":"object","title":null}`, []string{"/title"}, "title must be a string"},
		{"examples not array", `{"type":"object","examples":{}}`, []string{"/examples"}, "examples must be an array"},
		{"escaped path", obj(`"a/b~c":{"type":"bogus"}`), []string{"/properties/a~1b~0c/type"}, "unknown type"},
		{"invalid type still checks inside", obj(`"a":{"type":"obj","properties":{"b":{"type":"x"}},"required":["c"]}`),
			[]string{"/properties/a/properties/b/type", "/properties/a/required/0", "/properties/a/type"}, ""},
		{"several violations", `{"type":"object","$id":"x","required":["nope"],
			"properties":{
				"a":{"type":["string"]},
				"b":{"type":"integer","enum":[1.5],"items":{}},
				"c":{"oneOf":[{"type":"string"}],"title":1},
				"d":{"type":"array","items":{"type":"object","additionalProperties":{}}}}}`,
			[]string{"/$id", "/properties/a/type", "/properties/b/enum/0", "/properties/b/items",
				"/properties/c/oneOf", "/properties/c/title", "/properties/d/items/additionalProperties", "/required/0"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			canonical, err := CheckOutputSchema(decodeSchema(t, tt.schema))
			if canonical != "" {
				t.Fatalf("canonical %q returned with an error", canonical)
			}
			vs := violations(t, err)
			want := append([]string(nil), tt.paths...)
			sort.Strings(want)
			if got := violationPaths(vs); !reflect.DeepEqual(got, want) {
				t.Fatalf("violation paths = %q\nwant              %q\nviolations: %q", got, want, vs)
			}
			if !strings.Contains(vs[0], tt.contains) {
				t.Fatalf("first violation %q does not contain %q", vs[0], tt.contains)
			}
			if _, err := ParseOutputSchema(tt.schema); !errors.Is(err, ErrUnsupportedSchema) {
				t.Fatalf("ParseOutputSchema accepted the schema: %v", err)
			}
		})
	}
}

// TestCheckOutputSchemaGoValues covers values no JSON decoder produces but a
// Go caller might pass: NaN, ±Inf and -0 as float64, json.Number, other Go
// types, cycles and deep nesting.
func TestCheckOutputSchemaGoValues(t *testing.T) {
	prop := func(s map[string]any) map[string]any {
		return map[string]any{"type": "object", "properties": map[string]any{"a": s}}
	}
	cyclic := map[string]any{"type": "object"}
	cyclic["properties"] = map[string]any{"self": cyclic}
	deep := map[string]any{"type": "object"}
	for i := 0; i < 100; i++ {
		deep = map[string]any{"type": "array", "items": deep}
	}
	shared := map[string]any{"type": "object"}
	for i := 0; i < 30; i++ { // 2^30 paths without the schema limit
		shared = map[string]any{"type": "object", "properties": map[string]any{"a": shared, "b": shared}}
	}
	sharedValue := []any{}
	for i := 0; i < 30; i++ { // 2^30 paths without the container limit
		sharedValue = []any{sharedValue, sharedValue}
	}
	tests := []struct {
		name     string
		schema   any
		paths    []string
		contains string
	}{
		{"negative zero enum", prop(map[string]any{"type": "number", "enum": []any{1.0, math.Copysign(0, -1)}}), []string{"/properties/a/enum/1"}, "-0 is not allowed"},
		{"negative zero const", prop(map[string]any{"type": "integer", "const": math.Copysign(0, -1)}), []string{"/properties/a/const"}, "-0"},
		{"NaN const", prop(map[string]any{"type": "number", "const": math.NaN()}), []string{"/properties/a/const"}, "NaN is not a JSON number"},
		{"Inf enum", prop(map[string]any{"type": "number", "enum": []any{math.Inf(1), math.Inf(-1)}}), []string{"/properties/a/enum/0", "/properties/a/enum/1"}, "infinite"},
		{"Inf default", prop(map[string]any{"type": "number", "default": math.Inf(1)}), []string{"/properties/a/default"}, "infinite"},
		{"NaN in examples", prop(map[string]any{"examples": []any{map[string]any{"x": math.NaN()}}}), []string{"/properties/a/examples/0/x"}, "NaN"},
		{"json.Number -0", prop(map[string]any{"type": "integer", "enum": []any{json.Number("-0")}}), []string{"/properties/a/enum/0"}, "-0"},
		{"json.Number out of range", prop(map[string]any{"type": "number", "const": json.Number("1e400")}), []string{"/properties/a/const"}, "out of the range"},
		{"json.Number not a number", prop(map[string]any{"type": "number", "const": json.Number("0x10")}), []string{"/properties/a/const"}, "not a JSON number"},
		{"json.Number not integral", prop(map[string]any{"type": "integer", "enum": []any{json.Number("1.5")}}), []string{"/properties/a/enum/0"}, "not an integer"},
		{"float not integral", prop(map[string]any{"type": "integer", "enum": []any{int64(1), 1.0, 1.0000001}}), []string{"/properties/a/enum/2"}, "not an integer"},
		{"Go string slice", map[string]any{"type": "object", "required": []string{"a"}}, []string{"/required"}, "a Go []string"},
		{"Go float32", prop(map[string]any{"type": "number", "default": float32(1)}), []string{"/properties/a/default"}, "is not a JSON value"},
		{"cycle", cyclic, []string{"/properties/self"}, "contains itself"},
		{"shared subtrees", shared, []string{"(root)"}, "more than 1000 schemas"},
		{"shared annotation subtrees", map[string]any{"type": "object", "default": sharedValue}, []string{"(root)"}, "more than 10000 objects and arrays"},
		{"too deep", map[string]any{"type": "object", "properties": map[string]any{"a": deep}}, []string{"/properties/a" + strings.Repeat("/items", 63)}, "nests deeper"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := CheckOutputSchema(tt.schema)
			vs := violations(t, err)
			want := append([]string(nil), tt.paths...)
			sort.Strings(want)
			if got := violationPaths(vs); !reflect.DeepEqual(got, want) {
				t.Fatalf("violation paths = %q\nwant              %q\nviolations: %q", got, want, vs)
			}
			if !strings.Contains(vs[0], tt.contains) {
				t.Fatalf("first violation %q does not contain %q", vs[0], tt.contains)
			}
		})
	}

	// Go ints and json.Number values that JSON can carry are accepted.
	ok := prop(map[string]any{"type": "integer", "enum": []any{1, int64(2), uint64(3), json.Number("4"), 5.0}, "const": json.Number("5")})
	if canonical, err := CheckOutputSchema(ok); err != nil || !strings.Contains(canonical, `"enum":[1,2,3,4,5]`) {
		t.Fatalf("canonical = %s, %v", canonical, err)
	}
}

// TestCheckOutputSchemaBoundsItsSchemas: each schema compiles to a validator
// of several kilobytes, so a schema of schemaNodesMax schemas is the most a
// request can make Brood compile (found by FuzzCheckOutputSchema: 2 KiB per
// byte of `{},` oneOf branches, so a 1 MiB request compiled for gigabytes
// before this bound).
func TestCheckOutputSchemaBoundsItsSchemas(t *testing.T) {
	branches := func(n int) string {
		return `{"type":"object","properties":{"a":{"oneOf":[` + strings.Repeat(`{},`, n-1) + `{}]}}}`
	}
	// The root, property a, and its branches.
	atMost := decodeSchema(t, branches(schemaNodesMax-2))
	var err error
	allocated := fuzzcheck.Allocated(func() { _, err = CheckOutputSchema(atMost) })
	if err != nil {
		t.Fatalf("%d schemas refused: %v", schemaNodesMax, err)
	}
	if allocated > 16<<20 { // about 7 MiB measured

		t.Fatalf("checking %d schemas allocated %d bytes", schemaNodesMax, allocated)
	}
	_, err = CheckOutputSchema(decodeSchema(t, branches(schemaNodesMax-1)))
	vs := violations(t, err)
	if len(vs) != 1 || vs[0] != fmt.Sprintf("(root): the schema holds more than %d schemas (the root and those under properties, items and oneOf)", schemaNodesMax) {
		t.Fatalf("violations %q", vs)
	}
}

func TestCheckOutputSchemaCapsViolations(t *testing.T) {
	s := map[string]any{"type": "object"}
	for i := 0; i < schemaViolationsMax+10; i++ {
		s[strings.Repeat("k", i+1)] = true
	}
	_, err := CheckOutputSchema(s)
	vs := violations(t, err)
	if len(vs) != schemaViolationsMax+1 || vs[len(vs)-1] != "and 10 more violations" {
		t.Fatalf("got %d violations, last %q", len(vs), vs[len(vs)-1])
	}
}

func ExampleCheckOutputSchema() {
	_, err := CheckOutputSchema(map[string]any{
		"type": "object",
		"properties": map[string]any{
			"a": map[string]any{"type": []any{"string", "null"}},
			"b": map[string]any{"type": "integer", "enum": []any{1.5}},
		},
		"required": []any{"c"},
	})
	fmt.Println(err)
	// Output:
	// UNSUPPORTED_SCHEMA: outputSchema is outside the supported subset: /properties/a/type: type arrays are not supported (use oneOf with one branch per type); /properties/b/enum/0: 1.5 is not an integer; /required/0: "c" is not a declared property; use an object-rooted schema built from type, properties, required, additionalProperties, items, enum, const and oneOf
}
