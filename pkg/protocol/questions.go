package protocol

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Questions (docs/protocol.md §5.21): a request of kind question carries
// its text and either choices (the answer is one of them, as text) or an
// answerSchema (the answer is JSON the schema accepts), or neither (any
// text, or any JSON). CheckQuestion checks a question when it is opened,
// CheckAnswer an answer to it; both are INVALID_ARGUMENT errors naming
// what is wrong.

// CheckQuestion checks a question's fields against their bounds and
// returns its answerSchema as canonical JSON text ("" when it has none).
// A schema outside the subset ParseAnswerSchema accepts is an
// INVALID_ARGUMENT error listing the violations.
func CheckQuestion(question string, choices []string, answerSchema string) (string, error) {
	switch {
	case strings.TrimSpace(question) == "":
		return "", Errorf(CodeInvalidArgument, "a question needs its text (question)")
	case len(question) > RequestQuestionBytesMax || !utf8.ValidString(question):
		return "", Errorf(CodeInvalidArgument, "question must be UTF-8 text of at most %d bytes (it is %d)", RequestQuestionBytesMax, len(question))
	case len(choices) > RequestChoicesMax:
		return "", Errorf(CodeInvalidArgument, "a question has at most %d choices (it has %d)", RequestChoicesMax, len(choices))
	case len(choices) > 0 && answerSchema != "":
		return "", Errorf(CodeInvalidArgument, "a question has choices or an answerSchema, not both")
	}
	for i, c := range choices {
		switch {
		case strings.TrimSpace(c) == "":
			return "", Errorf(CodeInvalidArgument, "choices[%d] is empty", i)
		case len(c) > RequestChoiceBytesMax || !utf8.ValidString(c):
			return "", Errorf(CodeInvalidArgument, "choices[%d] must be UTF-8 text of at most %d bytes", i, RequestChoiceBytesMax)
		case slices.Contains(choices[:i], c):
			return "", Errorf(CodeInvalidArgument, "choices[%d] %q is listed twice", i, c)
		}
	}
	if answerSchema == "" {
		return "", nil
	}
	if len(answerSchema) > RequestAnswerSchemaBytesMax {
		return "", Errorf(CodeInvalidArgument, "answerSchema is %d bytes of JSON; the limit is %d", len(answerSchema), RequestAnswerSchemaBytesMax)
	}
	sch, err := ParseAnswerSchema(answerSchema)
	if err != nil {
		return "", Errorf(CodeInvalidArgument, "answerSchema is outside the supported subset: %s", violationsOf(err))
	}
	return sch.Canonical(), nil
}

// CheckAnswer checks the answer text or jsonText (JSON text; exactly one
// of them) to the question rec and returns the answer to record: the text
// as given, or the JSON as canonical JSON text. Text must be one of the
// question's choices when it has some, and JSON is refused then; JSON must
// be what its answerSchema accepts when it has one, and text is refused
// then; a question with neither takes either.
func CheckAnswer(rec RequestRecord, text, jsonText string) (string, string, error) {
	switch {
	case text == "" && jsonText == "":
		return "", "", Errorf(CodeInvalidArgument, "an answer to a question needs text or json")
	case text != "" && jsonText != "":
		return "", "", Errorf(CodeInvalidArgument, "an answer is text or json, not both")
	case len(text) > RequestAnswerBytesMax || len(jsonText) > RequestAnswerBytesMax || !utf8.ValidString(text) || !utf8.ValidString(jsonText):
		return "", "", Errorf(CodeInvalidArgument, "an answer must be UTF-8 text of at most %d bytes", RequestAnswerBytesMax)
	}
	if text != "" {
		switch {
		case rec.AnswerSchema != "":
			return "", "", Errorf(CodeInvalidArgument, "request %s asks for JSON its answerSchema accepts: answer with json, not text", rec.ID)
		case len(rec.Choices) > 0 && !slices.Contains(rec.Choices, text):
			return "", "", Errorf(CodeInvalidArgument, "answer %q is not one of the choices of request %s: %s", text, rec.ID, quoteAll(rec.Choices))
		}
		return text, "", nil
	}
	if len(rec.Choices) > 0 {
		return "", "", Errorf(CodeInvalidArgument, "request %s asks to choose one of %s: answer with text, not json", rec.ID, quoteAll(rec.Choices))
	}
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(jsonText))
	if err != nil {
		return "", "", Errorf(CodeInvalidArgument, "json is not one JSON value: %v", err)
	}
	if rec.AnswerSchema != "" {
		sch, err := ParseAnswerSchema(rec.AnswerSchema)
		if err != nil {
			return "", "", Errorf(CodeInternal, "the answerSchema of request %s does not compile: %w", rec.ID, err)
		}
		if msgs := sch.Validate(v); len(msgs) > 0 {
			if n := len(msgs) - schemaViolationsMax; n > 0 {
				msgs = append(msgs[:schemaViolationsMax], fmt.Sprintf("and %d more", n))
			}
			return "", "", Errorf(CodeInvalidArgument, "json does not match the answerSchema of request %s: %s", rec.ID, strings.Join(msgs, "; "))
		}
	}
	canonical, err := CanonicalJSON(v)
	if err != nil {
		return "", "", Errorf(CodeInvalidArgument, "json cannot be written as JSON: %v", err)
	}
	return "", canonical, nil
}

// violationsOf joins the violations of an UNSUPPORTED_SCHEMA error.
func violationsOf(err error) string {
	if e := AsError(err); e != nil {
		if v, ok := e.Details["violations"].([]string); ok {
			return strings.Join(v, "; ")
		}
	}
	return err.Error()
}

// quoteAll renders choices for messages: "a", "b".
func quoteAll(choices []string) string {
	q := make([]string, len(choices))
	for i, c := range choices {
		q[i] = fmt.Sprintf("%q", c)
	}
	return strings.Join(q, ", ")
}
