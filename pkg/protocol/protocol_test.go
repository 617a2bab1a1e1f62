package protocol

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"testing"
)

func TestCatalogueCodesAreUniqueAndComplete(t *testing.T) {
	codes := map[Code]bool{}
	nums := map[int]Code{}
	for _, e := range Catalogue {
		if codes[e.Code] {
			t.Errorf("code %s listed twice", e.Code)
		}
		codes[e.Code] = true
		if other, ok := nums[e.Number]; ok {
			t.Errorf("numeric code %d used by %s and %s", e.Number, other, e.Code)
		}
		nums[e.Number] = e.Code
		if e.Template == "" || e.Hint == "" {
			t.Errorf("%s lacks a template or hint", e.Code)
		}
	}
	for _, c := range []Code{CodeNoProvider, CodeDuplicateProvider, CodeUnsupportedCapability, CodeUnauthorized,
		CodeDraining, CodeDuplicateChild, CodeNotResumable, CodeDurabilityFailed, CodeActivationClosing,
		CodeParentUnavailable, CodeActivationTeardownFailed, CodeCancelled, CodeInvalidArgument, CodeDepthExceeded,
		CodeUnsupportedSchema, CodeInvalidToolFilter, CodeInvalidPersona, CodeLimitExceeded, CodeHostLost} {
		if !codes[c] {
			t.Errorf("docs/design.md §3 code %s missing from the catalogue", c)
		}
	}
}

func TestErrorsMatchByCode(t *testing.T) {
	err := fmt.Errorf("wrapped: %w", NewError(CodeNoProvider, map[string]any{"provider": "nope"}))
	tests := []struct {
		target error
		want   bool
	}{
		{ErrNoProvider, true},
		{ErrUnauthorized, false},
		{&Error{Code: CodeNoProvider, Message: "other text"}, true},
		{errors.New("NO_PROVIDER"), false},
	}
	for _, tt := range tests {
		if got := errors.Is(err, tt.target); got != tt.want {
			t.Errorf("errors.Is(%v, %v) = %v, want %v", err, tt.target, got, tt.want)
		}
	}
	if got := AsError(err).Message; got != `no provider named "nope" is registered; list live providers with `+"`brood providers`"+` or start a worker for it` {
		t.Errorf("message = %q", got)
	}
	if CodeOf(err) != CodeNoProvider || CodeNoProvider.Number() != 1002 {
		t.Errorf("CodeOf/Number wrong: %s %d", CodeOf(err), CodeNoProvider.Number())
	}
}

// TestErrorfKeepsItsCause: an error given to Errorf with %w is the Cause
// (errors.Is and errors.As reach it; the code still decides the match by
// code); with %v only its text is kept; the message and the wire form are the
// same either way, and the cause never travels.
func TestErrorfKeepsItsCause(t *testing.T) {
	root := errors.New("nats: timeout")
	other := errors.New("store: conflict")
	tests := []struct {
		name      string
		err       *Error
		reaches   []error
		reachesNo []error
	}{
		{"%w", Errorf(CodeUnavailable, "read the lease of %s: %w", "s1", root), []error{root, ErrUnavailable}, []error{other, ErrInternal}},
		{"%v", Errorf(CodeUnavailable, "read the lease of %s: %v", "s1", root), []error{ErrUnavailable}, []error{root}},
		{"two %w", Errorf(CodeUnavailable, "read the lease of %s: %w; then %w", "s1", root, other), []error{root, other, ErrUnavailable}, nil},
		{"wrapped chain", Errorf(CodeInternal, "settle: %w", fmt.Errorf("write: %w", root)), []error{root, ErrInternal}, []error{ErrUnavailable}},
		{"AsError", AsError(fmt.Errorf("encode: %w", root)), []error{root, ErrInternal}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, target := range tt.reaches {
				if !errors.Is(tt.err, target) {
					t.Errorf("errors.Is(%v, %v) = false, want true", tt.err, target)
				}
			}
			for _, target := range tt.reachesNo {
				if errors.Is(tt.err, target) {
					t.Errorf("errors.Is(%v, %v) = true, want false", tt.err, target)
				}
			}
			if !strings.Contains(tt.err.Message, "nats: timeout") {
				t.Errorf("message %q lost the cause's text", tt.err.Message)
			}
			wire, err := Marshal(JSON, tt.err)
			if err != nil {
				t.Fatal(err)
			}
			var back Error
			if err := Unmarshal(JSON, wire, &back); err != nil {
				t.Fatal(err)
			}
			if back.Code != tt.err.Code || back.Message != tt.err.Message || back.Cause != nil {
				t.Errorf("on the wire %s came back as %+v", wire, back)
			}
		})
	}
	if got, want := Errorf(CodeUnavailable, "x: %w", root).Message, Errorf(CodeUnavailable, "x: %v", root).Message; got != want {
		t.Errorf("%%w and %%v give different messages: %q and %q", got, want)
	}
}

func TestEncodingOfHeaderInAnyCase(t *testing.T) {
	tests := []struct {
		h    map[string][]string
		want Encoding
	}{
		{nil, Msgpack},
		{map[string][]string{"Content-Type": {"application/json"}}, JSON},
		{map[string][]string{"content-type": {"Application/JSON; charset=utf-8"}}, JSON},
		{map[string][]string{"CONTENT-TYPE": {"application/msgpack"}}, Msgpack},
		{map[string][]string{"Content-Type": {}}, Msgpack},
	}
	for _, tt := range tests {
		if got := EncodingOf(tt.h); got != tt.want {
			t.Errorf("EncodingOf(%v) = %v, want %v", tt.h, got, tt.want)
		}
	}
}

func TestStartRequestRoundTripsBothEncodings(t *testing.T) {
	persona := ""
	in := RunStartRequest{
		Provider: "spawn", Parent: ParentRef{SessionID: "S", Credential: "C"}, Prompt: Text("héllo ✓"),
		Notify: "_INBOX.x.1", Options: StartOptions{MaxDepth: int64(3), Persona: &persona, ToolFilter: &ToolFilter{Allow: []string{}}},
	}
	for _, enc := range []Encoding{Msgpack, JSON} {
		data, err := Marshal(enc, in)
		if err != nil {
			t.Fatal(err)
		}
		var out RunStartRequest
		if err := Unmarshal(enc, data, &out); err != nil {
			t.Fatal(err)
		}
		if out.Options.MaxDepth != int64(3) {
			t.Errorf("%v: maxDepth = %#v", enc, out.Options.MaxDepth)
		}
		if out.Options.Persona == nil || *out.Options.Persona != "" {
			t.Errorf("%v: empty persona must stay present and empty", enc)
		}
		if out.Options.ToolFilter == nil || out.Options.ToolFilter.Allow == nil || len(out.Options.ToolFilter.Allow) != 0 {
			t.Errorf("%v: allow [] must stay an empty, present list: %#v", enc, out.Options.ToolFilter)
		}
		if out.Options.ToolFilter.Deny != nil {
			t.Errorf("%v: absent deny must stay absent", enc)
		}
		if PlainText(out.Prompt) != "héllo ✓" {
			t.Errorf("%v: prompt = %q", enc, PlainText(out.Prompt))
		}
	}
}

func TestCompactIntegersAndExactValues(t *testing.T) {
	small, _ := Marshal(Msgpack, map[string]int64{"v": 7})
	if len(small) != 4 { // fixmap(1) + fixstr "v" (2) + positive fixint
		t.Errorf("int64 7 took %d bytes; compact ints expected", len(small))
	}
	for _, v := range []int64{0, -1, 1<<53 + 1, math.MaxInt64} {
		data, _ := Marshal(Msgpack, map[string]any{"v": v})
		var out map[string]any
		if err := Unmarshal(Msgpack, data, &out); err != nil {
			t.Fatal(err)
		}
		if out["v"] != v {
			t.Errorf("%d came back as %#v", v, out["v"])
		}
		var jout struct{ V any }
		jdata, _ := json.Marshal(map[string]int64{"V": v})
		_ = Unmarshal(JSON, jdata, &jout)
		if NormalizeNumbers(jout.V) != v {
			t.Errorf("JSON %d came back as %#v", v, jout.V)
		}
	}
}

func TestSeqTravelsAsString(t *testing.T) {
	in := InboxDequeueData{MessageID: "m", InboxSeq: Seq(1<<63 + 5), Turn: 2}
	for _, enc := range []Encoding{Msgpack, JSON} {
		data, _ := Marshal(enc, in)
		var generic map[string]any
		_ = Unmarshal(enc, data, &generic)
		if s, ok := generic["inboxSeq"].(string); !ok || s != "9223372036854775813" {
			t.Errorf("%v: inboxSeq on the wire = %#v", enc, generic["inboxSeq"])
		}
		var out InboxDequeueData
		if err := Unmarshal(enc, data, &out); err != nil || out != in {
			t.Errorf("%v: round trip %+v, %v", enc, out, err)
		}
	}
}

// TestSeqFromJSON: a sequence reads from a decimal string (escapes
// allowed), an unsigned integer or null, without a decoder of its own (one
// per sequence cost kilobytes per few request bytes; FuzzDecodeRequest).
func TestSeqFromJSON(t *testing.T) {
	tests := []struct {
		json string
		want Seq
		ok   bool
	}{
		{`"17"`, 17, true},
		{`"18446744073709551615"`, 1<<64 - 1, true},
		{`"\u0031\u0037"`, 17, true},
		{`17`, 17, true},
		{`null`, 0, true},
		{`"18446744073709551616"`, 0, false},
		{`"-1"`, 0, false},
		{`-1`, 0, false},
		{`1.5`, 0, false},
		{`"1 "`, 0, false},
		{`""`, 0, false},
		{`true`, 0, false},
		{`{"a":1}`, 0, false},
		{`["1"]`, 0, false},
	}
	for _, tt := range tests {
		var s Seq
		err := s.UnmarshalJSON([]byte(tt.json))
		if (err == nil) != tt.ok || s != tt.want {
			t.Errorf("%s: %d, %v; want %d, ok=%v", tt.json, s, err, tt.want, tt.ok)
		}
		var r InboxAckRequest
		err = UnmarshalRequest(JSON, []byte(`{"seqs":[`+tt.json+`]}`), &r)
		if (err == nil) != tt.ok || (tt.ok && (len(r.Seqs) != 1 || r.Seqs[0] != tt.want)) {
			t.Errorf("in a request %s: %v, %v", tt.json, r.Seqs, err)
		}
	}
	// One stray quote, as a direct caller might pass it.
	var s Seq
	if err := s.UnmarshalJSON([]byte(`"`)); err == nil {
		t.Error(`a lone quote was accepted`)
	}
	// A thousand sequences cost a few bytes each, not a decoder each.
	body := []byte(`{"seqs":[` + strings.Repeat(`"1",`, 999) + `"1"]}`)
	allocs := testing.AllocsPerRun(3, func() {
		var r InboxAckRequest
		_ = UnmarshalRequest(JSON, body, &r)
	})
	if allocs > 1200 {
		t.Errorf("decoding 1000 seqs allocated %.0f times", allocs)
	}
}

// TestRequestNestingIsTheSameInBothEncodings: 128 levels of arrays and
// maps pass and 129 do not, in MessagePack and in JSON alike.
func TestRequestNestingIsTheSameInBothEncodings(t *testing.T) {
	for _, depth := range []int{RequestDepthMax - 1, RequestDepthMax, RequestDepthMax + 1} {
		// options (1) and outputSchema's arrays: depth containers in all,
		// counting the request map itself.
		inner := depth - 2
		js := `{"options":{"outputSchema":` + strings.Repeat("[", inner) + strings.Repeat("]", inner) + `}}`
		var jv, mv RunStartRequest
		jerr := UnmarshalRequest(JSON, []byte(js), &jv)
		mp := append(mustHex(t, "81a76f7074696f6e7381ac6f7574707574536368656d61"), append(bytesOf(0x91, inner-1), 0x90)...)
		merr := UnmarshalRequest(Msgpack, mp, &mv)
		want := depth <= RequestDepthMax
		if (jerr == nil) != want || (merr == nil) != want {
			t.Errorf("depth %d: JSON %v, MessagePack %v; want accepted=%v", depth, jerr, merr, want)
		}
	}
}

// TestJSONNumbersBeyondADoubleAreRefused: 1e400 in an untyped field is
// INVALID_ARGUMENT rather than a NaN that no JSON reply could carry.
func TestJSONNumbersBeyondADoubleAreRefused(t *testing.T) {
	var v RunStartRequest
	err := UnmarshalRequest(JSON, []byte(`{"options":{"outputSchema":{"default":[1,-1e400]}}}`), &v)
	if err == nil || !strings.Contains(err.Error(), "-1e400 is out of the range") {
		t.Fatalf("err = %v", err)
	}
	var tiny RunStartRequest
	if err := UnmarshalRequest(JSON, []byte(`{"options":{"maxDepth":1e-400}}`), &tiny); err != nil || tiny.Options.MaxDepth != 0.0 {
		t.Fatalf("1e-400: %#v, %v", tiny.Options.MaxDepth, err)
	}
}

// TestRepeatedUntypedKeysAreRefusedNotPanics: the msgpack library panics
// when a map gives an untyped field's key twice; requests, replies and
// records alike get an error instead (a worker's run record must not crash
// the coordinator that reads it).
func TestRepeatedUntypedKeysAreRefusedNotPanics(t *testing.T) {
	tests := map[string]string{
		"maxDepth twice":       "81a76f7074696f6e7382a86d61784465707468 01 a86d61784465707468 02",
		"outputSchema twice":   "81a76f7074696f6e7382ac6f7574707574536368656d61 9101 ac6f7574707574536368656d61 9102",
		"outputSchema maps":    "81a76f7074696f6e7382ac6f7574707574536368656d61 81a16101 ac6f7574707574536368656d61 81a16202",
		"outputSchema strings": "81a76f7074696f6e7382ac6f7574707574536368656d61 a178 ac6f7574707574536368656d61 a179",
	}
	for name, h := range tests {
		b := mustHex(t, strings.ReplaceAll(h, " ", ""))
		var r RunStartRequest
		if err := UnmarshalRequest(Msgpack, b, &r); err == nil {
			t.Errorf("%s: request accepted", name)
		}
		if err := Unmarshal(Msgpack, b, &r); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A settled run record whose result gives "structured" twice.
	rec := mustHex(t, "81a6726573756c7482aa7374727563747572656401aa7374727563747572656402")
	var rr RunRecord
	if err := Unmarshal(Msgpack, rec, &rr); err == nil {
		t.Error("run record accepted")
	}
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func bytesOf(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }

func TestSubjectsAndNames(t *testing.T) {
	s := MustSubjects("")
	tests := map[string]string{
		s.Coord(EpRunsStart): "brood.v1.coord.runs.start",
		s.ProviderInstance("spawn", "H1", OpProviderStart): "brood.v1.provider.spawn.H1.start",
		s.Host("H1", OpHostDispose):                        "brood.v1.host.H1.dispose",
		s.Log("spawn", "S"):                                "brood.v1.log.spawn.S",
		s.LogAll():                                         "brood.v1.log.*.*",
		s.Events("spawn", "P", EventKindEnd):               "brood.v1.events.spawn.P.end",
		s.EventsAll("P"):                                   "brood.v1.events.*.P.*",
		s.LogsOf("spawn"):                                  "brood.v1.log.spawn.*",
		s.Inbox("spawn", "S"):                              "brood.v1.inbox.spawn.S",
		s.Inbox(ScopeRoot, "S"):                            "brood.v1.inbox.root.S",
		s.InboxAll():                                       "brood.v1.inbox.*.*",
		s.InboxesOf("fork"):                                "brood.v1.inbox.fork.*",
		s.StreamLog("spawn"):                               "BROOD_LOG_spawn",
		s.StreamLog(ScopeRoot):                             "BROOD_LOG_root",
		s.StreamInbox("acp"):                               "BROOD_INBOX_acp",
		MustSubjects("my-app").StreamInbox("a-b"):          "MY_APP_INBOX_a-b",
		s.BucketRuns():                                     "brood_runs",
	}
	for got, want := range tests {
		if got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
	if _, err := NewSubjects("a.b"); err == nil {
		t.Error("a prefix with a dot must be refused")
	}
	for id, ok := range map[string]bool{"abc_DEF-1": true, "": false, "a.b": false, "a*": false,
		strings.Repeat("z", 64): true, strings.Repeat("z", 65): false, "é": false, "a\n": false, "a b": false, "Z9": true} {
		if ValidID(id) != ok {
			t.Errorf("ValidID(%q) != %v", id, ok)
		}
	}
	// The rule of docs/design.md §4 as a regexp is the oracle over every byte.
	rule := regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	for c := 0; c < 256; c++ {
		for _, id := range []string{string([]byte{byte(c)}), "a" + string([]byte{byte(c)}) + "b"} {
			if ValidID(id) != rule.MatchString(id) {
				t.Errorf("ValidID(%q) = %v, the rule says %v", id, ValidID(id), rule.MatchString(id))
			}
		}
	}
}

func TestTruncateDiagnosticAtRuneBoundary(t *testing.T) {
	long := ""
	for len(long) < 5000 {
		long += "é"
	}
	got := TruncateDiagnostic(long)
	if len(got) > DiagnosticBytesMax {
		t.Errorf("len %d > %d", len(got), DiagnosticBytesMax)
	}
	if !json.Valid([]byte(`"` + got + `"`)) {
		t.Error("cut inside a rune")
	}
}

func TestZeroValuesInUntypedFieldsSurvive(t *testing.T) {
	in := RunStartRequest{Options: StartOptions{MaxDepth: int64(0), OutputSchema: map[string]any{}}}
	res := SubagentResult{Output: Text("x"), Structured: map[string]any{}, StopReason: StopCompleted}
	for _, enc := range []Encoding{Msgpack, JSON} {
		data, _ := Marshal(enc, in)
		var out RunStartRequest
		if err := Unmarshal(enc, data, &out); err != nil {
			t.Fatal(err)
		}
		if out.Options.MaxDepth != int64(0) || out.Options.OutputSchema == nil {
			t.Errorf("%v: zero maxDepth / empty schema lost: %#v", enc, out.Options)
		}
		data, _ = Marshal(enc, res)
		var rout SubagentResult
		_ = Unmarshal(enc, data, &rout)
		if rout.Structured == nil {
			t.Errorf("%v: empty structured object lost", enc)
		}
	}
}

func TestRequestEncodingSniffsJSONWithoutTheHeader(t *testing.T) {
	mp, err := Marshal(Msgpack, map[string]any{"cwd": "/tmp"})
	if err != nil {
		t.Fatal(err)
	}
	json := map[string][]string{HeaderContentType: {"Application/JSON; charset=utf-8"}}
	for _, tc := range []struct {
		name   string
		header map[string][]string
		body   []byte
		want   Encoding
	}{
		{"msgpack map", nil, mp, Msgpack},
		{"JSON object", nil, []byte(`{"cwd":"/tmp"}`), JSON},
		{"JSON after blanks", nil, []byte(" \t\r\n{}"), JSON},
		{"header wins", json, mp, JSON},
		{"empty", nil, nil, Msgpack},
		{"not JSON text", nil, []byte("cwd=/tmp"), Msgpack},
		{"a JSON array is no request", nil, []byte(`[1]`), Msgpack},
	} {
		if got := RequestEncoding(tc.header, tc.body); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestJSONIsWrittenWithoutHTMLEscaping(t *testing.T) {
	data, err := Marshal(JSON, Errorf(CodeInvalidArgument, "notify must be outside brood.> & <none>"))
	if err != nil {
		t.Fatal(err)
	}
	if s := string(data); !strings.Contains(s, "brood.> & <none>") || strings.Contains(s, `\u003e`) || strings.HasSuffix(s, "\n") {
		t.Fatalf("%s", data)
	}
}

func TestPromptSourceNamesTheAgentThatWroteIt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		parent SessionHeader
		want   MessageSource
	}{
		{"a client's root", SessionHeader{ID: "R"}, MessageSource{Kind: SourceUser}},
		{"an agent", SessionHeader{ID: "A", ParentSession: "R", Origin: OriginSubagent}, MessageSource{Kind: SourceCoordinator, Form: "relay", SenderSessionID: "A"}},
		{"a Brood ACP agent's root", SessionHeader{ID: "E", Origin: OriginReopenable}, MessageSource{Kind: SourceCoordinator, Form: "relay", SenderSessionID: "E"}},
	} {
		if got := PromptSource(tc.parent); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// A worker's leader read names its provider and bucket in its subject, in
// the family of a provider's reads (<p>.v1.read.<provider>.>), and nothing
// else parses as one.
func TestKVLatestSubjectNamesItsProviderAndBucket(t *testing.T) {
	s := MustSubjects("")
	subj := s.KVLatest("spawn", "brood_runs")
	if subj != "brood.v1.read.spawn.kvlatest.brood_runs" {
		t.Fatalf("KVLatest = %q", subj)
	}
	if p, b, ok := s.KVLatestOf(subj); !ok || p != "spawn" || b != "brood_runs" {
		t.Fatalf("KVLatestOf(%q) = %q, %q, %v", subj, p, b, ok)
	}
	for _, bad := range []string{"brood.v1.read.spawn.ancestry.C1", "brood.v1.read.spawn.kvlatest.a.b", "brood.v1.read.*.kvlatest.x",
		"brood.v1.epochend.spawn.C1", "brood.v1.read.spawn.kvlatest."} {
		if p, b, ok := s.KVLatestOf(bad); ok {
			t.Errorf("KVLatestOf(%q) = %q, %q; want no leader read", bad, p, b)
		}
	}
}

// TestDescriptorsOfAnotherModelDiffer: instances of one provider answer
// with the same models, so a descriptor naming another model (or another
// order) is another descriptor (DUPLICATE_PROVIDER at a worker's start;
// issue 37, item 3).
func TestDescriptorsOfAnotherModelDiffer(t *testing.T) {
	a := ModelInfo{Adapter: "openai", ID: "deepseek-chat"}
	b := ModelInfo{Adapter: "openai", ID: "deepseek-reasoner"}
	for _, tt := range []struct {
		name string
		x, y []ModelInfo
		eq   bool
	}{
		{"same", []ModelInfo{a}, []ModelInfo{a}, true},
		{"none", nil, nil, true},
		{"another id", []ModelInfo{a}, []ModelInfo{b}, false},
		{"one named, one not (agrees)", []ModelInfo{a}, nil, true},
		{"another default", []ModelInfo{a, b}, []ModelInfo{b, a}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			x := ProviderDescriptor{Name: "spawn", Models: tt.x}
			y := ProviderDescriptor{Name: "spawn", Models: tt.y}
			if x.Equal(y) != tt.eq || y.Equal(x) != tt.eq {
				t.Fatalf("Equal = %v, want %v", x.Equal(y), tt.eq)
			}
		})
	}
}
