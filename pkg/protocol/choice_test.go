package protocol_test

import (
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// TestResolveChildChoice is the admission rule of a start's model and turn
// limits (docs/protocol.md §5.5, "Model and turn limits"; issue 37, item 3).
func TestResolveChildChoice(t *testing.T) {
	small := protocol.ModelInfo{Adapter: "scripted", ID: "small"}
	large := protocol.ModelInfo{Adapter: "scripted", ID: "large"}
	chat := protocol.ModelInfo{Adapter: "openai", ID: "chat"}
	otherChat := protocol.ModelInfo{Adapter: "scripted", ID: "chat"}
	worker := protocol.DefaultTurnLimits()
	desc := protocol.ProviderDescriptor{Name: "spawn", Models: []protocol.ModelInfo{small, large}, Limits: &worker}
	bare := protocol.ProviderDescriptor{Name: "acp"}
	twoChats := protocol.ProviderDescriptor{Name: "mixed", Models: []protocol.ModelInfo{chat, otherChat}, Limits: &worker}
	parent5 := protocol.SessionHeader{Limits: &protocol.TurnLimits{StepsPerTurnMax: 5}}
	tests := []struct {
		name       string
		desc       protocol.ProviderDescriptor
		parent     protocol.SessionHeader
		model      string
		limits     *protocol.TurnLimits
		wantCode   protocol.Code
		wantModel  *protocol.ModelInfo
		wantLimits *protocol.TurnLimits
	}{
		{name: "nothing asked: the worker's limits, no model chosen", desc: desc, wantLimits: &worker},
		{name: "an id", desc: desc, model: "large", wantModel: &large, wantLimits: &worker},
		{name: "adapter/id", desc: desc, model: "scripted/large", wantModel: &large, wantLimits: &worker},
		{name: "not offered", desc: desc, model: "huge", wantCode: protocol.CodeInvalidArgument},
		{name: "another adapter's id", desc: desc, model: "openai/large", wantCode: protocol.CodeInvalidArgument},
		{name: "an id two models share", desc: twoChats, model: "chat", wantCode: protocol.CodeInvalidArgument},
		{name: "an id two models share, with its adapter", desc: twoChats, model: "openai/chat", wantModel: &chat, wantLimits: &worker},
		{name: "a provider naming no models", desc: bare, model: "small", wantCode: protocol.CodeUnsupportedCapability},
		{name: "inherits the parent's choice", desc: desc, parent: protocol.SessionHeader{Model: &large}, wantModel: &large, wantLimits: &worker},
		{name: "names another than its parent", desc: desc, parent: protocol.SessionHeader{Model: &large}, model: "small", wantModel: &small, wantLimits: &worker},
		{name: "a parent's choice the provider does not offer: the default", desc: desc, parent: protocol.SessionHeader{Model: &chat}, wantLimits: &worker},
		{name: "tightens", desc: desc, limits: &protocol.TurnLimits{StepsPerTurnMax: 2, TurnTimeoutMs: 1000},
			wantLimits: &protocol.TurnLimits{TurnTimeoutMs: 1000, StepsPerTurnMax: 2, ToolCallsPerStepMax: 32}},
		{name: "equal to the worker's", desc: desc, limits: &protocol.TurnLimits{ToolCallsPerStepMax: 32}, wantLimits: &worker},
		{name: "more steps than the worker's", desc: desc, limits: &protocol.TurnLimits{StepsPerTurnMax: 65}, wantCode: protocol.CodeInvalidArgument},
		{name: "more tool calls than the worker's", desc: desc, limits: &protocol.TurnLimits{ToolCallsPerStepMax: 33}, wantCode: protocol.CodeInvalidArgument},
		{name: "a longer turn than the worker's", desc: desc, limits: &protocol.TurnLimits{TurnTimeoutMs: protocol.DefaultTurnTimeoutMs + 1}, wantCode: protocol.CodeInvalidArgument},
		{name: "inherits the parent's", desc: desc, parent: parent5,
			wantLimits: &protocol.TurnLimits{TurnTimeoutMs: protocol.DefaultTurnTimeoutMs, StepsPerTurnMax: 5, ToolCallsPerStepMax: 32}},
		{name: "more than the parent's", desc: desc, parent: parent5, limits: &protocol.TurnLimits{StepsPerTurnMax: 6}, wantCode: protocol.CodeInvalidArgument},
		{name: "less than the parent's", desc: desc, parent: parent5, limits: &protocol.TurnLimits{StepsPerTurnMax: 4},
			wantLimits: &protocol.TurnLimits{TurnTimeoutMs: protocol.DefaultTurnTimeoutMs, StepsPerTurnMax: 4, ToolCallsPerStepMax: 32}},
		{name: "negative", desc: desc, limits: &protocol.TurnLimits{StepsPerTurnMax: -1}, wantCode: protocol.CodeInvalidArgument},
		{name: "above 2^53-1", desc: desc, limits: &protocol.TurnLimits{TurnTimeoutMs: 1 << 53}, wantCode: protocol.CodeInvalidArgument},
		{name: "limits of a provider that describes none", desc: bare, limits: &protocol.TurnLimits{StepsPerTurnMax: 2}, wantCode: protocol.CodeUnsupportedCapability},
		{name: "a provider describing none still carries the parent's", desc: bare, parent: parent5, wantLimits: &protocol.TurnLimits{StepsPerTurnMax: 5}},
		{name: "an empty request is no request", desc: bare, limits: &protocol.TurnLimits{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := protocol.ResolveChildChoice(tc.desc, tc.parent, tc.model, tc.limits)
			if protocol.CodeOf(err) != tc.wantCode {
				t.Fatalf("error %v, want code %q", err, tc.wantCode)
			}
			if err != nil {
				return
			}
			if (c.Model == nil) != (tc.wantModel == nil) || (c.Model != nil && *c.Model != *tc.wantModel) {
				t.Fatalf("model %v, want %v", c.Model, tc.wantModel)
			}
			if (c.Limits == nil) != (tc.wantLimits == nil) || (c.Limits != nil && *c.Limits != *tc.wantLimits) {
				t.Fatalf("limits %+v, want %+v", c.Limits, tc.wantLimits)
			}
		})
	}
}

// TestTurnLimitsValidate: each limit a positive safe integer or absent; the
// refusal names the limit and its unit.
func TestTurnLimitsValidate(t *testing.T) {
	for _, tc := range []struct {
		l    protocol.TurnLimits
		want string // the limit named, "" for valid
	}{
		{protocol.TurnLimits{}, ""},
		{protocol.DefaultTurnLimits(), ""},
		{protocol.TurnLimits{TurnTimeoutMs: 1<<53 - 1}, ""},
		{protocol.TurnLimits{TurnTimeoutMs: 1 << 53}, "turnTimeoutMs"},
		{protocol.TurnLimits{StepsPerTurnMax: -1}, "stepsPerTurnMax"},
		{protocol.TurnLimits{ToolCallsPerStepMax: -5}, "toolCallsPerStepMax"},
	} {
		err := tc.l.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", tc.l, err)
			}
			continue
		}
		pe := protocol.AsError(err)
		if pe == nil || pe.Code != protocol.CodeInvalidArgument || pe.Details["limit"] != tc.want {
			t.Errorf("%+v: %v, want INVALID_ARGUMENT naming %s", tc.l, err, tc.want)
		}
	}
}

// TestDescriptorsWithOtherLimitsDiffer: two instances of one provider with
// other turn limits are not one provider (DUPLICATE_PROVIDER), while a
// descriptor that describes none agrees with any, as for models.
func TestDescriptorsWithOtherLimitsDiffer(t *testing.T) {
	a, b := protocol.DefaultTurnLimits(), protocol.DefaultTurnLimits()
	b.StepsPerTurnMax = 3
	d := protocol.ProviderDescriptor{Name: "spawn", Tools: []string{}, Limits: &a}
	o := d
	o.Limits = &b
	if d.Equal(o) {
		t.Fatal("descriptors with other limits are equal")
	}
	o.Limits = nil
	if !d.Equal(o) {
		t.Fatal("a descriptor without limits does not agree")
	}
	same := a
	o.Limits = &same
	if !d.Equal(o) {
		t.Fatal("equal limits differ")
	}
}
