package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/pkg/protocol"
)

// This file holds structured capture (docs/upstream-behaviour.md §1.6): the
// child-only structured_output tool that validates the model's value
// against the run's output schema (checked by pkg/protocol's
// CheckOutputSchema when the start was admitted).

const (
	// invalidArgsMessagesMax bounds the validator messages in one
	// INVALID_ARGS result; the model needs the first few, not all.
	invalidArgsMessagesMax = 8
	// recordedText is the structured_output result of a valid capture.
	recordedText = `{"recorded":true}`
)

// StructuredOutputInstruction is the child-only system-prompt section of a
// run that requested an outputSchema (docs/upstream-behaviour.md §1.6). Only
// children get it: the capture tool exists only there.
const StructuredOutputInstruction = "Structured output: this task requires a structured result. " +
	"You must finish by calling the structured_output tool exactly once, with arguments that are one JSON value matching its parameter schema. " +
	"A valid call records your result and ends your turn; a call rejected with INVALID_ARGS records nothing, so fix the value and call structured_output again. " +
	"Finishing without a successful structured_output call is a failure: text answers are not your result."

// structuredOutputDescription is the tool description shown to the model.
const structuredOutputDescription = "Record this task's result: one JSON value matching the parameter schema. " +
	"Call it exactly once, as your last action; a valid call ends your turn. " +
	"A rejected call (INVALID_ARGS) records nothing: fix the value and call again."

// StructuredOutputTool builds the child-only structured_output tool for a
// run that requested an outputSchema (docs/upstream-behaviour.md §1.6). schemaJSON is
// the schema as JSON text (the canonical text protocol.CheckOutputSchema
// returned); it is checked again and compiled once here
// (protocol.ParseOutputSchema), and an unsupported or malformed schema is an
// UNSUPPORTED_SCHEMA error.
//
// The tool's Parameters are the schema. Run decodes the raw arguments with
// exact numbers and validates them: a valid value gives the result
// {"recorded":true} with Conclude set (the turn ends) and Structured the
// value's canonical JSON, integers kept exactly; invalid JSON, a mismatch
// with the schema, or a number outside the range of a double gives an error
// result starting "INVALID_ARGS: " with up to invalidArgsMessagesMax
// validator messages, and the model may call again in the same turn. Run is
// safe for concurrent use.
func StructuredOutputTool(schemaJSON string) (*Tool, error) {
	sch, err := protocol.ParseOutputSchema(schemaJSON)
	if err != nil {
		return nil, err
	}
	return &Tool{
		Name:        model.StructuredOutputTool,
		Description: structuredOutputDescription,
		Parameters:  json.RawMessage(sch.Canonical()),
		Run: func(_ context.Context, _ ToolContext, args string) ToolResult {
			return captureStructured(sch, args)
		},
	}, nil
}

// captureStructured validates one structured_output call.
func captureStructured(sch *protocol.OutputSchema, args string) ToolResult {
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(args))
	if err != nil {
		return ErrorResult("INVALID_ARGS: the arguments are not one JSON value (%v); call structured_output again with a value matching the schema", err)
	}
	msgs := sch.Validate(v)
	if len(msgs) > 0 {
		if n := len(msgs) - invalidArgsMessagesMax; n > 0 {
			msgs = append(msgs[:invalidArgsMessagesMax], fmt.Sprintf("and %d more", n))
		}
		return ErrorResult("INVALID_ARGS: %s; fix the value and call structured_output again", strings.Join(msgs, "; "))
	}
	canonical, err := protocol.CanonicalJSON(v)
	if err != nil {
		return ErrorResult("INVALID_ARGS: the value cannot be written as JSON (%v); call structured_output again", err)
	}
	return ToolResult{Content: protocol.Text(recordedText), Conclude: true, Structured: canonical}
}
