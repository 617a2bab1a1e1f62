package protocol

import (
	"fmt"
	"strings"
	"time"
)

// A start's choice of model and turn limits (docs/protocol.md §5.5, "Model
// and turn limits"; issue 37, item 3): validated here, at admission, against
// the child's provider descriptor and its parent's header, so nothing is
// started on a model the provider does not offer or with limits above what
// its parent and its worker allow.

// Worker defaults of the turn limits (docs/protocol.md §10), each named with
// its unit.
const (
	DefaultTurnTimeoutMs       int64 = 10 * 60 * 1000 // 10 minutes
	DefaultStepsPerTurnMax     int64 = 64
	DefaultToolCallsPerStepMax int64 = 32
)

// TurnLimits bound every turn of a session's agent. A zero field is absent:
// no bound of its own (the other bounds still hold). The same shape is a
// worker's settings (ProviderDescriptor.Limits), a start's request
// (StartOptions.Limits, which may only tighten) and a child's effective
// limits (SessionHeader.Limits, at most its parent's).
type TurnLimits struct {
	// TurnTimeoutMs bounds one turn's wall time, in milliseconds (worker
	// default 600 000, 10 minutes); past it the turn ends `error`,
	// LIMIT_EXCEEDED.
	TurnTimeoutMs int64 `msgpack:"turnTimeoutMs,omitempty" json:"turnTimeoutMs,omitempty"`
	// StepsPerTurnMax bounds the model calls of one turn, in steps (worker
	// default 64); a turn that would take one more ends `error`,
	// LIMIT_EXCEEDED.
	StepsPerTurnMax int64 `msgpack:"stepsPerTurnMax,omitempty" json:"stepsPerTurnMax,omitempty"`
	// ToolCallsPerStepMax bounds the tool calls of one assistant message, in
	// calls (worker default 32); a message with more ends the turn `error`,
	// LIMIT_EXCEEDED.
	ToolCallsPerStepMax int64 `msgpack:"toolCallsPerStepMax,omitempty" json:"toolCallsPerStepMax,omitempty"`
}

// DefaultTurnLimits are a worker's limits unless it is configured otherwise.
func DefaultTurnLimits() TurnLimits {
	return TurnLimits{TurnTimeoutMs: DefaultTurnTimeoutMs, StepsPerTurnMax: DefaultStepsPerTurnMax, ToolCallsPerStepMax: DefaultToolCallsPerStepMax}
}

// IsZero reports whether no field is set.
func (l TurnLimits) IsZero() bool { return l == TurnLimits{} }

// TurnTimeout is TurnTimeoutMs as a duration (0 when absent).
func (l TurnLimits) TurnTimeout() time.Duration {
	return time.Duration(l.TurnTimeoutMs) * time.Millisecond
}

// Narrow returns, field by field, the smaller of l and o; an absent field
// takes the other's.
func (l TurnLimits) Narrow(o TurnLimits) TurnLimits {
	min := func(a, b int64) int64 {
		switch {
		case a <= 0:
			return b
		case b <= 0 || a < b:
			return a
		}
		return b
	}
	return TurnLimits{
		TurnTimeoutMs:       min(l.TurnTimeoutMs, o.TurnTimeoutMs),
		StepsPerTurnMax:     min(l.StepsPerTurnMax, o.StepsPerTurnMax),
		ToolCallsPerStepMax: min(l.ToolCallsPerStepMax, o.ToolCallsPerStepMax),
	}
}

// NarrowPtr is Narrow over optional limits: nil when both are absent.
func NarrowPtr(a, b *TurnLimits) *TurnLimits {
	var l TurnLimits
	if a != nil {
		l = *a
	}
	if b != nil {
		l = l.Narrow(*b)
	}
	if l.IsZero() {
		return nil
	}
	return &l
}

// limitField is one named limit with its unit.
type limitField struct {
	name, unit string
	v          int64
}

func (l TurnLimits) fields() []limitField {
	return []limitField{
		{"turnTimeoutMs", "milliseconds", l.TurnTimeoutMs},
		{"stepsPerTurnMax", "steps", l.StepsPerTurnMax},
		{"toolCallsPerStepMax", "tool calls", l.ToolCallsPerStepMax},
	}
}

// maxSafeInteger is 2^53 − 1, the largest integer every client decodes exactly.
const maxSafeInteger = 1<<53 - 1

// Validate checks limits as a start or a worker sets them: each field
// absent (0) or a positive integer up to 2^53−1; else INVALID_ARGUMENT
// naming the limit and its unit.
func (l TurnLimits) Validate() error {
	for _, f := range l.fields() {
		if f.v < 0 || f.v > maxSafeInteger {
			return NewError(CodeInvalidArgument, map[string]any{"limit": f.name,
				"reason": fmt.Sprintf("limits.%s must be a positive number of %s up to 2^53−1 (or absent), not %d", f.name, f.unit, f.v)})
		}
	}
	return nil
}

// within refuses a request above its bound: a start may ask for less than
// its parent and its worker allow, never more (INVALID_ARGUMENT naming the
// limit, its unit, what was asked and what is allowed).
func (l TurnLimits) within(bound TurnLimits) error {
	b := bound.fields()
	for i, f := range l.fields() {
		if f.v > 0 && b[i].v > 0 && f.v > b[i].v {
			return NewError(CodeInvalidArgument, map[string]any{"limit": f.name, "requested": f.v, "allowed": b[i].v,
				"reason": fmt.Sprintf("limits.%s %d is above the %d %s allowed here (the parent's limits and the worker's settings); a start may only tighten a limit", f.name, f.v, b[i].v, f.unit)})
		}
	}
	return nil
}

// Offers reports whether the descriptor lists model m.
func (d ProviderDescriptor) Offers(m ModelInfo) bool {
	for _, x := range d.Models {
		if x == m {
			return true
		}
	}
	return false
}

// ResolveModel finds a start's `model` among the models the descriptor
// offers: "adapter/id" names one exactly, a bare id names the one model
// with that id. A provider that names no models cannot honour the option
// (UNSUPPORTED_CAPABILITY, capability "model"); a model it does not offer,
// or a bare id two of its models share, is INVALID_ARGUMENT listing what it
// offers.
func ResolveModel(d ProviderDescriptor, name string) (ModelInfo, error) {
	if len(d.Models) == 0 {
		return ModelInfo{}, NewError(CodeUnsupportedCapability, map[string]any{"provider": d.Name, "capability": "model"})
	}
	offered := make([]string, len(d.Models))
	for i, m := range d.Models {
		offered[i] = m.String()
	}
	var found []ModelInfo
	for _, m := range d.Models {
		if m.String() == name {
			return m, nil
		}
		if m.ID == name {
			found = append(found, m)
		}
	}
	if len(found) == 1 {
		return found[0], nil
	}
	why := "is not offered"
	if len(found) > 1 {
		why = "names several models; give adapter/id"
	}
	return ModelInfo{}, NewError(CodeInvalidArgument, map[string]any{"option": "model", "model": name, "offered": offered,
		"reason": fmt.Sprintf("model %q %s by provider %s (it offers %s)", name, why, d.Name, strings.Join(offered, ", "))})
}

// ChildChoice is the model and turn limits a child runs with, as its header
// records them.
type ChildChoice struct {
	// Model is the model chosen for the child: the start's `model`, else
	// its parent's chosen model when the child's provider offers it; nil
	// means the provider's default (its descriptor's first model).
	Model *ModelInfo
	// Limits are the child's effective turn limits: its parent's, its
	// provider's settings and the start's request, field by field the
	// smallest; nil when none of them sets any.
	Limits *TurnLimits
}

// ResolveChildChoice decides a child's model and turn limits at admission
// (docs/protocol.md §5.5, "Model and turn limits"), from the child's
// provider descriptor d, its parent's header and the start's `model` and
// `limits` options. Errors, in this order: UNSUPPORTED_CAPABILITY (a model
// asked of a provider that names none) → INVALID_ARGUMENT (the model is not
// offered) → UNSUPPORTED_CAPABILITY (limits asked of a provider that
// describes none) → INVALID_ARGUMENT (a limit is not a positive safe
// integer; a limit is above its parent's or its worker's).
func ResolveChildChoice(d ProviderDescriptor, parent SessionHeader, model string, limits *TurnLimits) (ChildChoice, error) {
	var c ChildChoice
	switch {
	case model != "":
		m, err := ResolveModel(d, model)
		if err != nil {
			return c, err
		}
		c.Model = &m
	case parent.Model != nil && d.Offers(*parent.Model):
		m := *parent.Model
		c.Model = &m
	}
	if limits != nil && !limits.IsZero() && d.Limits == nil {
		return c, NewError(CodeUnsupportedCapability, map[string]any{"provider": d.Name, "capability": "limits"})
	}
	bound := NarrowPtr(parent.Limits, d.Limits)
	if limits != nil {
		if err := limits.Validate(); err != nil {
			return c, err
		}
		if bound != nil {
			if err := limits.within(*bound); err != nil {
				return c, err
			}
		}
	}
	c.Limits = NarrowPtr(bound, limits)
	return c, nil
}
