package coordinator

import (
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/brood-dev/brood/pkg/protocol"
)

// MaxSafeInteger is 2^53 − 1, the largest integer every client decodes exactly.
const MaxSafeInteger = 1<<53 - 1

// checkCapabilities refuses options the provider lacks, in upstream's order
// (docs/upstream-behaviour.md §1.3): outputSchema, depthLimit (maxDepth), toolFilter, persona.
func checkCapabilities(d protocol.ProviderDescriptor, o protocol.StartOptions) error {
	refuse := func(capability string) error {
		return protocol.NewError(protocol.CodeUnsupportedCapability, map[string]any{"provider": d.Name, "capability": capability})
	}
	switch {
	case o.OutputSchema != nil && !d.Capabilities.OutputSchema:
		return refuse("outputSchema")
	case o.MaxDepth != nil && !d.Capabilities.DepthLimit:
		return refuse("maxDepth (depthLimit)")
	case o.ToolFilter != nil && !d.Capabilities.ToolFilter:
		return refuse("toolFilter")
	case o.Persona != nil && !d.Capabilities.Persona:
		return refuse("persona")
	}
	return nil
}

// ParseMaxDepth validates a maxDepth value: a non-negative safe integer
// (docs/upstream-behaviour.md §1.2): -1, 1.5, NaN, -0 and 2^53 are INVALID_ARGUMENT.
func ParseMaxDepth(v any) (int64, error) {
	bad := func(why string) (int64, error) {
		return 0, protocol.Errorf(protocol.CodeInvalidArgument, "maxDepth must be a non-negative safe integer (0 … 2^53−1): %s", why)
	}
	switch x := v.(type) {
	case int64:
		if x < 0 {
			return bad(fmt.Sprintf("%d is negative", x))
		}
		if x > MaxSafeInteger {
			return bad(fmt.Sprintf("%d is above 2^53−1", x))
		}
		return x, nil
	case uint64:
		if x > MaxSafeInteger {
			return bad(fmt.Sprintf("%d is above 2^53−1", x))
		}
		return int64(x), nil
	case int8, int16, int32, int, uint8, uint16, uint32, uint:
		return ParseMaxDepth(toInt64(x))
	case float32:
		return ParseMaxDepth(float64(x))
	case float64:
		switch {
		case math.IsNaN(x):
			return bad("NaN")
		case math.IsInf(x, 0):
			return bad("infinite")
		case x == 0 && math.Signbit(x):
			return bad("-0")
		case x != math.Trunc(x):
			return bad(fmt.Sprintf("%v is not an integer", x))
		case x < 0:
			return bad(fmt.Sprintf("%v is negative", x))
		case x > MaxSafeInteger:
			return bad(fmt.Sprintf("%v is above 2^53−1", x))
		}
		return int64(x), nil
	default:
		return bad(fmt.Sprintf("got %T", v))
	}
}

func toInt64(v any) int64 {
	switch x := v.(type) {
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case int:
		return int64(x)
	case uint8:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case uint:
		return int64(x)
	}
	return 0
}

// resolveDepth returns the child's depth and its absolute depth cap (the
// narrowest of the request's maxDepth and every ancestor's cap: a child can
// narrow a limit, never widen it), or DEPTH_EXCEEDED.
func resolveDepth(parent protocol.SessionHeader, maxDepth *int64) (int64, *int64, error) {
	if parent.DelegationDepth >= MaxSafeInteger {
		return 0, nil, protocol.Errorf(protocol.CodeInvalidArgument, "the parent's depth %d leaves no room for a child", parent.DelegationDepth)
	}
	child := parent.DelegationDepth + 1
	cap := parent.DepthCap
	if maxDepth != nil && (cap == nil || *maxDepth < *cap) {
		v := *maxDepth
		cap = &v
	}
	if cap != nil && child > *cap {
		return 0, nil, protocol.NewError(protocol.CodeDepthExceeded, map[string]any{"attemptedDepth": child, "maxDepth": *cap})
	}
	return child, cap, nil
}

// intersectCeiling narrows a parent's ceiling by a child's filter: a tool is
// allowed below only if every ancestor allowed it (docs/design.md §10).
func intersectCeiling(parent *protocol.ToolFilter, f *protocol.ToolFilter) *protocol.ToolFilter {
	if f == nil {
		return parent
	}
	if parent == nil {
		c := *f
		return &c
	}
	out := &protocol.ToolFilter{}
	switch {
	case parent.Allow == nil:
		out.Allow = f.Allow
	case f.Allow == nil:
		out.Allow = parent.Allow
	default:
		out.Allow = []string{}
		for _, a := range parent.Allow {
			if contains(f.Allow, a) {
				out.Allow = append(out.Allow, a)
			}
		}
	}
	out.Deny = append(append([]string(nil), parent.Deny...), f.Deny...)
	return out
}

// checkToolFilter validates a filter against the provider's tools and the
// parent's ceiling: a tool the parent may not use cannot be allowed below it.
func checkToolFilter(d protocol.ProviderDescriptor, ceiling *protocol.ToolFilter, f protocol.ToolFilter) error {
	if err := protocol.ValidateToolFilter(f, d.Tools); err != nil {
		return err
	}
	for _, a := range f.Allow {
		if !ceiling.Allows(a) {
			return protocol.NewError(protocol.CodeInvalidToolFilter, map[string]any{
				"reason": fmt.Sprintf("tool %s is outside the parent's tool ceiling; a child never gets a tool an ancestor was denied", a)})
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// checkSchema validates an outputSchema against the supported subset
// (docs/upstream-behaviour.md §1.6; UNSUPPORTED_SCHEMA lists every offending path)
// and returns its canonical JSON text.
func (c *Coordinator) checkSchema(schema any) (string, error) {
	return protocol.CheckOutputSchema(schema)
}

// checkPrompt checks a prompt, followup message or report: text blocks only,
// each UTF-8 (docs/protocol.md §5 and §10; raw bytes from a msgpack client are
// refused here, for every client: issue 37, item 4), not empty, at most
// PromptBytesMax bytes in all.
func (c *Coordinator) checkPrompt(prompt []protocol.ContentBlock) error {
	size := 0
	for i, b := range prompt {
		if b.Type != protocol.BlockText {
			return protocol.Errorf(protocol.CodeInvalidArgument, "prompt block type %q is not supported; use text blocks", b.Type)
		}
		if !utf8.ValidString(b.Text) {
			return protocol.Errorf(protocol.CodeInvalidArgument, "prompt block %d is not UTF-8 text", i)
		}
		size += len(b.Text)
	}
	if len(prompt) == 0 || size == 0 {
		return protocol.Errorf(protocol.CodeInvalidArgument, "prompt is empty")
	}
	if size > c.cfg.PromptBytesMax {
		return protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
			"limit": "prompt bytes", "reason": fmt.Sprintf("the prompt is %d bytes; the limit is %d", size, c.cfg.PromptBytesMax)})
	}
	return nil
}

// validNotify checks a client-chosen notify subject: printable ASCII literal
// tokens, at most protocol.NotifySubjectBytesMax bytes, and never a subject of the deployment itself or
// of the system ($JS, $KV, $SRV…): the settling host publishes there with its
// own permissions, so a notify subject must not reach Brood's state.
func (c *Coordinator) validNotify(s string) bool {
	if s == "" || len(s) > protocol.NotifySubjectBytesMax || strings.HasPrefix(s, "$") || strings.HasPrefix(s, c.subj.Prefix()+".") {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r > '~' || r == '*' || r == '>' {
			return false
		}
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" {
			return false
		}
	}
	return true
}
