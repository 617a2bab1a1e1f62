package protocol

import (
	"encoding/hex"
	"strings"
	"testing"
)

func TestCheckMsgpackRefusesHugeDeclarationsAndDeepNesting(t *testing.T) {
	deep := strings.Repeat("91", RequestDepthMax+2) + "c0" // arrays of one, nested
	tests := []struct {
		name, hex string
		ok        bool
	}{
		{"array32 of 2^31-1 items in 13 bytes", "81a670726f6d7074dd7fffffff", false},
		{"map32 of 2^31-1 pairs", "81a670726f6d7074df7fffffff", false},
		{"str32 longer than the message", "db7fffffff61", false},
		{"bin32 longer than the message", "c67fffffff61", false},
		{"deep nesting", deep, false},
		{"trailing bytes", "c0c0", false},
		{"reserved code", "c1", false},
		{"truncated float64", "cb0000", false},
		{"ext8 with its type byte", "c70101ff", true},
		{"nil", "c0", true},
		{"small map", "81a161a162", true},
	}
	for _, tt := range tests {
		b, err := hex.DecodeString(tt.hex)
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckMsgpack(b, RequestDepthMax); (err == nil) != tt.ok {
			t.Errorf("%s: err = %v, want ok=%v", tt.name, err, tt.ok)
		}
		var v RunStartRequest
		if uerr := UnmarshalRequest(Msgpack, b, &v); tt.ok == false && uerr == nil {
			t.Errorf("%s: UnmarshalRequest accepted it", tt.name)
		}
	}
}

func TestEveryEncodedRequestPassesTheCheck(t *testing.T) {
	p := "persona"
	values := []any{
		RunStartRequest{Provider: "spawn", Parent: ParentRef{SessionID: "S", Credential: "C"}, Prompt: Text("héllo"),
			Options: StartOptions{MaxDepth: int64(3), Persona: &p, OutputSchema: map[string]any{"type": "object", "properties": map[string]any{"a": map[string]any{"type": "integer"}}}}},
		ContinuableStartRequest{Provider: "spawn", Parent: ParentRef{SessionID: "S"}, Label: "l", Prompt: Text("x")},
		FollowupRequest{ChildID: "C", Message: Text("y"), Authority: Authority{Grant: "g"}},
		DrainRequest{Parents: []string{"a", "b"}},
		LogRecord{Events: []SessionEvent{{Seq: 1, Type: EvTurnStart, Data: mustMarshal(t, TurnData{Turn: 1})}}},
	}
	for _, v := range values {
		data := mustMarshal(t, v)
		if err := CheckMsgpack(data, RequestDepthMax); err != nil {
			t.Errorf("%T: %v", v, err)
		}
	}
}

func TestUnknownRequestFieldsAreRefused(t *testing.T) {
	data := mustMarshal(t, map[string]any{"provider": "spawn", "options": map[string]any{"bogus": 1}})
	var r RunStartRequest
	if err := UnmarshalRequest(Msgpack, data, &r); err == nil {
		t.Fatal("an unknown option was accepted")
	}
	if err := UnmarshalRequest(JSON, []byte(`{"provider":"spawn","options":{"bogus":1}}`), &r); err == nil {
		t.Fatal("an unknown JSON option was accepted")
	}
	var c ContinuableStartRequest
	if err := UnmarshalRequest(JSON, []byte(`{"provider":"spawn","options":{"outputSchema":{}}}`), &c); err == nil {
		t.Fatal("outputSchema on a continuable start was accepted and would be ignored")
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := Marshal(Msgpack, v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
