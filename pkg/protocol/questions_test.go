package protocol_test

import (
	"strings"
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// TestCheckQuestion (issue 33, item 2(b)): a question's text, choices and
// answerSchema are bounded and named when refused (INVALID_ARGUMENT); an
// answerSchema is the output-schema subset with any root, returned
// canonical.
func TestCheckQuestion(t *testing.T) {
	many := make([]string, protocol.RequestChoicesMax+1)
	for i := range many {
		many[i] = strings.Repeat("c", i+1)
	}
	tests := []struct {
		name     string
		question string
		choices  []string
		schema   string
		says     string // "" : accepted
		want     string // the canonical schema
	}{
		{"free text", "Which file?", nil, "", "", ""},
		{"choices", "Which?", []string{"a", "b"}, "", "", ""},
		{"the most choices", "Which?", many[:protocol.RequestChoicesMax], "", "", ""},
		{"an object schema, canonical", "How many?", nil, `{ "type": "object", "properties": {"n": {"type": "integer"}} }`, "", `{"properties":{"n":{"type":"integer"}},"type":"object"}`},
		{"a scalar root", "How many?", nil, `{"type":"integer"}`, "", `{"type":"integer"}`},
		{"no text", "  ", nil, "", "needs its text", ""},
		{"text too long", strings.Repeat("q", protocol.RequestQuestionBytesMax+1), nil, "", "at most 16384 bytes", ""},
		{"not UTF-8", "a\xffb", nil, "", "UTF-8", ""},
		{"too many choices", "Which?", many, "", "at most 32 choices", ""},
		{"an empty choice", "Which?", []string{"a", " "}, "", "choices[1] is empty", ""},
		{"a choice too long", "Which?", []string{strings.Repeat("c", protocol.RequestChoiceBytesMax+1)}, "", "choices[0] must be UTF-8 text of at most 1024 bytes", ""},
		{"a choice twice", "Which?", []string{"a", "b", "a"}, "", `choices[2] "a" is listed twice`, ""},
		{"choices and a schema", "Which?", []string{"a"}, `{"type":"string"}`, "not both", ""},
		{"a schema outside the subset", "How many?", nil, `{"type":"integer","minimum":1}`, `answerSchema is outside the supported subset: /minimum: unknown keyword "minimum"`, ""},
		{"a schema that is no JSON", "How many?", nil, `{"type":`, "answerSchema is outside the supported subset", ""},
		{"a schema too large", "How many?", nil, `{"type":"string","description":"` + strings.Repeat("d", protocol.RequestAnswerSchemaBytesMax) + `"}`, "the limit is 65536", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := protocol.CheckQuestion(tt.question, tt.choices, tt.schema)
			if tt.says == "" {
				if err != nil || got != tt.want {
					t.Fatalf("CheckQuestion = %q, %v; want %q", got, err, tt.want)
				}
				return
			}
			if protocol.CodeOf(err) != protocol.CodeInvalidArgument || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("CheckQuestion = %v, want INVALID_ARGUMENT naming %q", err, tt.says)
			}
		})
	}
}

// TestCheckAnswer (issue 33, item 2(b)): an answer is text or JSON; text
// must be one of the choices when there are some, JSON what the
// answerSchema accepts when there is one (recorded canonical); anything
// else is INVALID_ARGUMENT naming what is wrong.
func TestCheckAnswer(t *testing.T) {
	free := protocol.RequestRecord{ID: "r1", Kind: protocol.RequestQuestion, Question: "Q?"}
	choice := protocol.RequestRecord{ID: "r2", Kind: protocol.RequestQuestion, Question: "Q?", Choices: []string{"yes", "no"}}
	schema := protocol.RequestRecord{ID: "r3", Kind: protocol.RequestQuestion, Question: "Q?",
		AnswerSchema: `{"additionalProperties":false,"properties":{"n":{"type":"integer"}},"required":["n"],"type":"object"}`}
	tests := []struct {
		name       string
		rec        protocol.RequestRecord
		text, json string
		says       string // "" : accepted
		wantText   string
		wantJSON   string
	}{
		{"free text", free, "anything", "", "", "anything", ""},
		{"free JSON, canonical", free, "", ` {"b": 1, "a": [true, null]} `, "", "", `{"a":[true,null],"b":1}`},
		{"a choice", choice, "no", "", "", "no", ""},
		{"JSON the schema accepts", schema, "", `{"n": 12345678901234567890}`, "", "", `{"n":12345678901234567890}`},
		{"neither", free, "", "", "needs text or json", "", ""},
		{"both", free, "a", `"a"`, "not both", "", ""},
		{"not a choice", choice, "maybe", "", `"maybe" is not one of the choices of request r2: "yes", "no"`, "", ""},
		{"a choice differs in case", choice, "Yes", "", "is not one of the choices", "", ""},
		{"JSON for choices", choice, "", `"yes"`, "answer with text, not json", "", ""},
		{"text for a schema", schema, "12", "", "answer with json, not text", "", ""},
		{"JSON the schema refuses", schema, "", `{"n":1.5}`, "json does not match the answerSchema of request r3: /n: got number, want integer", "", ""},
		{"JSON with more", schema, "", `{"n":1,"m":2}`, "json does not match the answerSchema", "", ""},
		{"no JSON", free, "", `{"n":`, "json is not one JSON value", "", ""},
		{"too long", free, strings.Repeat("a", protocol.RequestAnswerBytesMax+1), "", "at most 65536 bytes", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			text, js, err := protocol.CheckAnswer(tt.rec, tt.text, tt.json)
			if tt.says == "" {
				if err != nil || text != tt.wantText || js != tt.wantJSON {
					t.Fatalf("CheckAnswer = %q, %q, %v; want %q, %q", text, js, err, tt.wantText, tt.wantJSON)
				}
				return
			}
			if protocol.CodeOf(err) != protocol.CodeInvalidArgument || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("CheckAnswer = %v, want INVALID_ARGUMENT naming %q", err, tt.says)
			}
		})
	}
}
