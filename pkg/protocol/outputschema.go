package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// This file holds output schemas (docs/upstream-behaviour.md §1.6): the check of a
// requested outputSchema against the supported subset, which the
// coordinator runs when it admits a start, and the validation of a
// structured_output value against a checked schema, which the child's
// structured_output tool runs (internal/agent).

const (
	// schemaDepthMax bounds the JSON nesting of an output schema (objects
	// and arrays, annotations included); it also stops cyclic Go values.
	schemaDepthMax = 64
	// schemaContainersMax bounds the objects and arrays one check visits, so
	// a Go value sharing subtrees cannot make the walk exponential.
	schemaContainersMax = 10_000
	// schemaNodesMax bounds the schemas one output schema holds (the root
	// and every schema under properties, items and oneOf). Each compiles
	// to a validator of its own, several kilobytes (up to about 20 KiB
	// deep down), so this bound keeps a check and its compilation within a
	// few tens of megabytes however the payload is spent.
	schemaNodesMax = 1_000
	// schemaViolationsMax bounds the violations listed in one error; the
	// rest are counted in a last entry.
	schemaViolationsMax = 64
	// schemaURL names the compiled schema; nothing is ever loaded from it.
	schemaURL = "urn:brood:structured_output"
)

// structuralKeywords are the keywords that constrain a value, in the order
// violations about them are reported.
var structuralKeywords = []string{"properties", "required", "additionalProperties", "items", "enum", "const"}

var schemaTypes = map[string]bool{
	"object": true, "array": true, "string": true, "number": true, "integer": true, "boolean": true, "null": true,
}

var scalarTypes = map[string]bool{"string": true, "number": true, "integer": true, "boolean": true, "null": true}

// schemaMsgPrinter renders the validator's messages.
var schemaMsgPrinter = message.NewPrinter(language.English)

// CheckOutputSchema checks a decoded outputSchema against the supported
// subset (docs/upstream-behaviour.md §1.6) and returns it as canonical JSON text:
// compact, object keys sorted, numbers as decoded (json.Number literals
// verbatim), no HTML escaping. The text compiles as a JSON Schema 2020-12
// document.
//
// schema is a decoded JSON value: objects are map[string]any, arrays []any,
// numbers int, int64, uint64, float64 or json.Number (NormalizeNumbers
// gives the first three), plus strings, bools and nil. Any other Go type is a
// violation.
//
// The subset: every schema is an object using only type, oneOf, properties,
// required, additionalProperties, items, enum and const plus the annotations
// description, title (strings), default and examples (an array); a schema
// has type or oneOf, never both, and one with neither carries annotations
// only (it accepts any JSON); type is one of object, array, string, number,
// integer, boolean, null; oneOf has at least two branches and no structural
// siblings; properties, required and additionalProperties (a boolean) only
// on object, items only on array, enum and const only on scalar types;
// required lists declared properties once each; enum is non-empty; enum and
// const values match the type and const is among the enum values; numbers
// anywhere are finite and not -0, and integer values are integral; the root
// has type "object"; at most schemaDepthMax levels of nesting,
// schemaContainersMax objects and arrays, schemaNodesMax schemas.
//
// On failure the error is one UNSUPPORTED_SCHEMA *Error whose
// details "violations" ([]string) lists every violation as
// "<path>: <problem>", path a JSON pointer into the schema ("(root)" for the
// root itself); at most schemaViolationsMax are listed, the rest counted.
func CheckOutputSchema(schema any) (canonical string, err error) {
	canonical, _, err = checkOutputSchema(schema, true)
	return canonical, err
}

// checkOutputSchema is CheckOutputSchema also returning the compiled
// schema; rootObject asks that the root have type "object" (an output
// schema's does; a question's answerSchema may have any root).
func checkOutputSchema(schema any, rootObject bool) (string, *jsonschema.Schema, error) {
	c := &schemaChecker{open: map[uintptr]bool{}}
	if m, ok := schema.(map[string]any); ok && rootObject {
		if t, _ := m["type"].(string); t != "object" {
			c.add("", `the root schema must have type "object"`)
		}
	}
	c.node("", schema, 0)
	if len(c.violations) > 0 {
		return "", nil, c.err()
	}
	canonical, err := CanonicalJSON(schema)
	if err != nil {
		return "", nil, unsupportedSchema(fmt.Sprintf("(root): the schema cannot be written as JSON: %v", err))
	}
	// The subset is meant to compile; a failure here is a gap in the check
	// above, reported rather than trusted.
	sch, err := compileSchema(canonical)
	if err != nil {
		return "", nil, unsupportedSchema(fmt.Sprintf("(root): the schema does not compile: %v", err))
	}
	return canonical, sch, nil
}

// OutputSchemaViolationsMax is the most violations one UNSUPPORTED_SCHEMA
// error lists; the rest are counted in one last entry.
const OutputSchemaViolationsMax = schemaViolationsMax

// OutputSchema is a checked and compiled output schema: what a child's
// structured_output tool validates its value against.
type OutputSchema struct {
	canonical string
	sch       *jsonschema.Schema
}

// ParseOutputSchema checks schemaJSON (JSON text, such as the canonical text
// CheckOutputSchema returned) as CheckOutputSchema does and compiles it once.
// Malformed JSON or an unsupported schema is an UNSUPPORTED_SCHEMA error.
func ParseOutputSchema(schemaJSON string) (*OutputSchema, error) {
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(schemaJSON))
	if err != nil {
		return nil, unsupportedSchema(fmt.Sprintf("(root): the schema is not one JSON value: %v", err))
	}
	canonical, sch, err := checkOutputSchema(v, true)
	if err != nil {
		return nil, err
	}
	return &OutputSchema{canonical: canonical, sch: sch}, nil
}

// ParseAnswerSchema checks and compiles a question's answerSchema (§5.21):
// the subset of ParseOutputSchema, bounded alike, except that the root may
// have any type (or none: any JSON). It is an UNSUPPORTED_SCHEMA error
// listing the violations otherwise.
func ParseAnswerSchema(schemaJSON string) (*OutputSchema, error) {
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(schemaJSON))
	if err != nil {
		return nil, unsupportedSchema(fmt.Sprintf("(root): the schema is not one JSON value: %v", err))
	}
	canonical, sch, err := checkOutputSchema(v, false)
	if err != nil {
		return nil, err
	}
	return &OutputSchema{canonical: canonical, sch: sch}, nil
}

// Canonical returns the schema's canonical JSON text.
func (s *OutputSchema) Canonical() string { return s.canonical }

// Validate returns what is wrong with the decoded JSON value v (decode it
// with jsonschema.UnmarshalJSON, numbers exact) against the schema, as
// "<path>: <problem>" messages with path a JSON pointer into v ("(root)"
// for v itself): every mismatch the validator reports, and every number no
// double holds (such as 1e400), which would not survive the decoders
// downstream. It is empty when v is valid.
func (s *OutputSchema) Validate(v any) []string {
	var msgs []string
	if err := s.sch.Validate(v); err != nil {
		var verr *jsonschema.ValidationError
		if errors.As(err, &verr) {
			msgs = leafMessages(verr, msgs)
		} else {
			msgs = append(msgs, err.Error())
		}
	}
	return outOfRangeNumbers("", v, msgs)
}

// leafMessages appends the messages of verr's leaves as "<path>: <message>".
func leafMessages(verr *jsonschema.ValidationError, out []string) []string {
	if len(verr.Causes) == 0 {
		return append(out, showPath(jsonPointerOf(verr.InstanceLocation))+": "+verr.ErrorKind.LocalizedString(schemaMsgPrinter))
	}
	for _, c := range verr.Causes {
		out = leafMessages(c, out)
	}
	return out
}

// outOfRangeNumbers appends a message for every number in v that no double
// holds (such as 1e400): it would not survive the decoders downstream.
func outOfRangeNumbers(path string, v any, out []string) []string {
	switch x := v.(type) {
	case json.Number:
		if _, err := strconv.ParseFloat(string(x), 64); err != nil {
			out = append(out, fmt.Sprintf("%s: %s is out of the range of a double", showPath(path), x))
		}
	case map[string]any:
		for _, k := range schemaKeys(x) {
			out = outOfRangeNumbers(path+"/"+pointerToken(k), x[k], out)
		}
	case []any:
		for i, e := range x {
			out = outOfRangeNumbers(path+"/"+strconv.Itoa(i), e, out)
		}
	}
	return out
}

// compileSchema compiles canonical schema text as JSON Schema 2020-12. The
// loader refuses every URL: a schema in the subset refers to nothing.
func compileSchema(canonical string) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(canonical))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(jsonschema.SchemeURLLoader{})
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, err
	}
	return c.Compile(schemaURL)
}

// canonicalJSON writes v compactly with sorted keys and no HTML escaping.
func CanonicalJSON(v any) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(buf.String(), "\n"), nil
}

func unsupportedSchema(violations ...string) *Error {
	return NewError(CodeUnsupportedSchema, map[string]any{"violations": violations})
}

// schemaChecker walks one schema collecting violations.
type schemaChecker struct {
	violations []string
	dropped    int
	containers int
	nodes      int
	stopped    bool
	// open holds the objects and arrays on the current path, to report a
	// cycle instead of walking it.
	open map[uintptr]bool
}

func (c *schemaChecker) add(path, format string, args ...any) {
	if len(c.violations) >= schemaViolationsMax {
		c.dropped++
		return
	}
	c.violations = append(c.violations, showPath(path)+": "+fmt.Sprintf(format, args...))
}

func (c *schemaChecker) err() *Error {
	v := c.violations
	if c.dropped > 0 {
		v = append(v, fmt.Sprintf("and %d more violations", c.dropped))
	}
	return unsupportedSchema(v...)
}

// enter admits the object or array x at path for walking; leave must follow
// when it returns true.
func (c *schemaChecker) enter(path string, x any, depth int) bool {
	if c.stopped {
		return false
	}
	c.containers++
	if c.containers > schemaContainersMax {
		c.stopped = true
		c.add("", "the schema has more than %d objects and arrays", schemaContainersMax)
		return false
	}
	if depth > schemaDepthMax {
		c.add(path, "the schema nests deeper than %d levels", schemaDepthMax)
		return false
	}
	if p := containerPointer(x); p != 0 {
		if c.open[p] {
			c.add(path, "the schema contains itself (a cycle)")
			return false
		}
		c.open[p] = true
	}
	return true
}

func (c *schemaChecker) leave(x any) {
	if p := containerPointer(x); p != 0 {
		delete(c.open, p)
	}
}

// containerPointer identifies a non-empty map or slice; empty ones cannot
// hold a cycle (and empty slices may share one address).
func containerPointer(x any) uintptr {
	v := reflect.ValueOf(x)
	if (v.Kind() == reflect.Map || v.Kind() == reflect.Slice) && v.Len() > 0 {
		return v.Pointer()
	}
	return 0
}

// node checks one schema at path.
func (c *schemaChecker) node(path string, v any, depth int) {
	m, ok := v.(map[string]any)
	if !ok {
		c.add(path, "a schema must be a JSON object, not %s", jsonKind(v))
		return
	}
	if !c.enter(path, m, depth) {
		return
	}
	defer c.leave(m)
	if c.nodes++; c.nodes > schemaNodesMax {
		c.stopped = true
		c.add("", "the schema holds more than %d schemas (the root and those under properties, items and oneOf)", schemaNodesMax)
		return
	}
	c.keywords(path, m, depth)
	typ, hasType := m["type"]
	oneOf, hasOneOf := m["oneOf"]
	tname := ""
	if hasType {
		tname = c.typeName(path+"/type", typ)
	}
	switch {
	case hasType && hasOneOf:
		c.add(path, "a schema has either type or oneOf, never both")
		fallthrough
	case hasOneOf:
		c.oneOf(path+"/oneOf", oneOf, depth+1)
		c.forStructural(path, m, "%s is not allowed next to oneOf (put it inside the branches)")
	case hasType:
		c.typed(path, m, tname, depth)
	default:
		c.forStructural(path, m, "%s needs a type on the same schema (a schema without type or oneOf accepts any JSON and carries only annotations)")
	}
}

// keywords checks every keyword is known and every annotation well formed.
func (c *schemaChecker) keywords(path string, m map[string]any, depth int) {
	for _, k := range schemaKeys(m) {
		kp := path + "/" + pointerToken(k)
		switch v := m[k]; k {
		case "description", "title":
			if _, ok := v.(string); !ok {
				c.add(kp, "%s must be a string, not %s", k, jsonKind(v))
			}
		case "default":
			c.value(kp, v, depth+1)
		case "examples":
			if _, ok := v.([]any); !ok {
				c.add(kp, "examples must be an array, not %s", jsonKind(v))
				continue
			}
			c.value(kp, v, depth+1)
		case "type", "oneOf", "properties", "required", "additionalProperties", "items", "enum", "const":
		default:
			c.add(kp, "unknown keyword %q", k)
		}
	}
}

// forStructural reports every structural keyword of m with format.
func (c *schemaChecker) forStructural(path string, m map[string]any, format string) {
	for _, k := range structuralKeywords {
		if _, ok := m[k]; ok {
			c.add(path+"/"+k, format, k)
		}
	}
}

// typeName returns the type named by v at path, or "" (reported) when v
// names none.
func (c *schemaChecker) typeName(path string, v any) string {
	switch x := v.(type) {
	case string:
		if schemaTypes[x] {
			return x
		}
		c.add(path, "unknown type %q (use one of object, array, string, number, integer, boolean, null)", x)
	case []any:
		c.add(path, "type arrays are not supported (use oneOf with one branch per type)")
	default:
		c.add(path, "type must be a string, not %s", jsonKind(v))
	}
	return ""
}

func (c *schemaChecker) oneOf(path string, v any, depth int) {
	branches, ok := v.([]any)
	if !ok {
		c.add(path, "oneOf must be an array of schemas, not %s", jsonKind(v))
		return
	}
	if len(branches) < 2 {
		c.add(path, "oneOf needs at least 2 branches, got %d", len(branches))
	}
	if !c.enter(path, branches, depth) {
		return
	}
	defer c.leave(branches)
	for i, b := range branches {
		c.node(path+"/"+strconv.Itoa(i), b, depth+1)
	}
}

// typed checks the structural keywords of a schema with a type; t is ""
// when the type itself was invalid, and then only the keywords' own shapes
// are checked.
func (c *schemaChecker) typed(path string, m map[string]any, t string, depth int) {
	// applies reports whether keyword k is present and allowed on type t,
	// reporting it when misplaced.
	applies := func(k string) bool {
		if _, ok := m[k]; !ok {
			return false
		}
		if ok, where := keywordAllowed(k, t); !ok {
			c.add(path+"/"+k, "%s is only allowed on %s", k, where)
			return false
		}
		return true
	}
	var declared map[string]any
	if applies("properties") {
		declared = c.properties(path+"/properties", m["properties"], depth+1)
	}
	if applies("required") {
		c.required(path+"/required", m["required"], declared)
	}
	if applies("additionalProperties") {
		if v := m["additionalProperties"]; !isBool(v) {
			c.add(path+"/additionalProperties", "additionalProperties must be a boolean (schemas are not supported), not %s", jsonKind(v))
		}
	}
	if applies("items") {
		c.node(path+"/items", m["items"], depth+1)
	}
	var enum []any
	if applies("enum") {
		enum = c.enum(path+"/enum", m["enum"], t, depth+1)
	}
	if applies("const") {
		cv := m["const"]
		if c.scalar(path+"/const", cv, t, depth+1) && enum != nil && t != "" && !containsScalar(enum, cv) {
			c.add(path+"/const", "const %s is not one of the enum values", displayScalar(cv))
		}
	}
}

// keywordAllowed reports whether structural keyword k may appear on type t
// ("" for an invalid type: anything goes, the type was reported), and if
// not, where it may.
func keywordAllowed(k, t string) (bool, string) {
	if t == "" {
		return true, ""
	}
	switch k {
	case "properties", "required", "additionalProperties":
		return t == "object", `type "object"`
	case "items":
		return t == "array", `type "array"`
	default: // enum, const
		return scalarTypes[t], `scalar types (string, number, integer, boolean, null)`
	}
}

// properties checks a properties map and returns it (nil when malformed).
func (c *schemaChecker) properties(path string, v any, depth int) map[string]any {
	props, ok := v.(map[string]any)
	if !ok {
		c.add(path, "properties must be an object mapping names to schemas, not %s", jsonKind(v))
		return nil
	}
	if !c.enter(path, props, depth) {
		return props
	}
	defer c.leave(props)
	for _, k := range schemaKeys(props) {
		c.node(path+"/"+pointerToken(k), props[k], depth+1)
	}
	return props
}

func (c *schemaChecker) required(path string, v any, declared map[string]any) {
	names, ok := v.([]any)
	if !ok {
		c.add(path, "required must be an array of property names, not %s", jsonKind(v))
		return
	}
	seen := map[string]bool{}
	for i, n := range names {
		ip := path + "/" + strconv.Itoa(i)
		s, ok := n.(string)
		switch {
		case !ok:
			c.add(ip, "a required name must be a string, not %s", jsonKind(n))
		case seen[s]:
			c.add(ip, "%q is listed twice", s)
		default:
			if _, ok := declared[s]; !ok {
				c.add(ip, "%q is not a declared property", s)
			}
		}
		if ok {
			seen[s] = true
		}
	}
}

// enum checks an enum and returns its values when every one is valid.
func (c *schemaChecker) enum(path string, v any, t string, depth int) []any {
	values, ok := v.([]any)
	if !ok {
		c.add(path, "enum must be an array, not %s", jsonKind(v))
		return nil
	}
	if len(values) == 0 {
		c.add(path, "enum must not be empty")
		return nil
	}
	valid := true
	for i, e := range values {
		if !c.scalar(path+"/"+strconv.Itoa(i), e, t, depth) {
			valid = false
		}
	}
	if !valid {
		return nil
	}
	return values
}

// scalar checks an enum or const value against type t ("" when the type was
// invalid: then only that it is good JSON). It reports whether v is valid.
func (c *schemaChecker) scalar(path string, v any, t string, depth int) bool {
	if t == "" {
		before := len(c.violations) + c.dropped
		c.value(path, v, depth)
		return len(c.violations)+c.dropped == before
	}
	r, isNum, problem := schemaNumber(v)
	if problem != "" {
		c.add(path, "%s", problem)
		return false
	}
	var ok bool
	switch t {
	case "string":
		_, ok = v.(string)
	case "boolean":
		_, ok = v.(bool)
	case "null":
		ok = v == nil
	case "number":
		ok = isNum
	case "integer":
		if isNum && !r.IsInt() {
			c.add(path, "%s is not an integer", displayScalar(v))
			return false
		}
		ok = isNum
	}
	if !ok {
		c.add(path, "%s does not match type %q", jsonKind(v), t)
	}
	return ok
}

// value checks that v is JSON that survives a round trip (annotations,
// upstream's "lossless JSON").
func (c *schemaChecker) value(path string, v any, depth int) {
	switch x := v.(type) {
	case nil, bool, string:
	case map[string]any:
		if !c.enter(path, x, depth) {
			return
		}
		defer c.leave(x)
		for _, k := range schemaKeys(x) {
			c.value(path+"/"+pointerToken(k), x[k], depth+1)
		}
	case []any:
		if !c.enter(path, x, depth) {
			return
		}
		defer c.leave(x)
		for i, e := range x {
			c.value(path+"/"+strconv.Itoa(i), e, depth+1)
		}
	default:
		_, isNum, problem := schemaNumber(v)
		switch {
		case problem != "":
			c.add(path, "%s", problem)
		case !isNum:
			c.add(path, "%s is not a JSON value", jsonKind(v))
		}
	}
}

// schemaNumber returns v as an exact rational when it is a JSON number; a
// number JSON cannot carry exactly (NaN, ±Inf, -0, beyond a double) has a
// problem instead.
func schemaNumber(v any) (r *big.Rat, isNum bool, problem string) {
	switch x := v.(type) {
	case int:
		return new(big.Rat).SetInt64(int64(x)), true, ""
	case int64:
		return new(big.Rat).SetInt64(x), true, ""
	case uint64:
		return new(big.Rat).SetInt(new(big.Int).SetUint64(x)), true, ""
	case float64:
		switch {
		case math.IsNaN(x):
			return nil, true, "NaN is not a JSON number"
		case math.IsInf(x, 0):
			return nil, true, "an infinite number is not a JSON number"
		case x == 0 && math.Signbit(x):
			return nil, true, "-0 is not allowed: numbers must be finite and not -0"
		}
		return new(big.Rat).SetFloat64(x), true, ""
	case json.Number:
		s := string(x)
		r, ok := new(big.Rat).SetString(s)
		if !ok || s == "" || (s[0] != '-' && (s[0] < '0' || s[0] > '9')) || !json.Valid([]byte(s)) {
			return nil, true, fmt.Sprintf("%q is not a JSON number", s)
		}
		if _, err := strconv.ParseFloat(s, 64); err != nil {
			return nil, true, fmt.Sprintf("%s is out of the range of a double", s)
		}
		if r.Sign() == 0 && s[0] == '-' {
			return nil, true, "-0 is not allowed: numbers must be finite and not -0"
		}
		return r, true, ""
	}
	return nil, false, ""
}

// containsScalar reports whether values holds v, numbers compared by value.
func containsScalar(values []any, v any) bool {
	for _, e := range values {
		if scalarEqual(e, v) {
			return true
		}
	}
	return false
}

func scalarEqual(a, b any) bool {
	ra, aNum, _ := schemaNumber(a)
	rb, bNum, _ := schemaNumber(b)
	if aNum || bNum {
		return aNum && bNum && ra != nil && rb != nil && ra.Cmp(rb) == 0
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case string:
		y, ok := b.(string)
		return ok && x == y
	}
	return false
}

// jsonKind names v's JSON kind for messages.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case string:
		return "a string"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	}
	if _, isNum, _ := schemaNumber(v); isNum {
		return "a number"
	}
	return fmt.Sprintf("a Go %T", v)
}

// displayScalar renders a scalar for messages.
func displayScalar(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}

// jsonPointerOf joins tokens as a JSON pointer.
func jsonPointerOf(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(pointerToken(t))
	}
	return b.String()
}

// pointerToken escapes one JSON pointer token (RFC 6901).
func pointerToken(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// showPath shows a JSON pointer, the root as "(root)".
func showPath(p string) string {
	if p == "" {
		return "(root)"
	}
	return p
}

func isBool(v any) bool {
	_, ok := v.(bool)
	return ok
}

// schemaKeys returns m's keys sorted, so violations come in a stable order.
func schemaKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
