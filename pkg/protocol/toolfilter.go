package protocol

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// ValidateToolFilter checks a tool filter against the global tool names known:
// at least one of allow/deny, every name known (docs/upstream-behaviour.md §1.7). The
// error is INVALID_TOOL_FILTER listing the known tools.
func ValidateToolFilter(f ToolFilter, known []string) error {
	if f.Allow == nil && f.Deny == nil {
		return NewError(CodeInvalidToolFilter, map[string]any{
			"reason": "a tool filter must name at least one of allow or deny ({} restricts nothing)"})
	}
	set := map[string]bool{}
	for _, k := range known {
		set[k] = true
	}
	var unknown []string
	for _, n := range append(append([]string{}, f.Allow...), f.Deny...) {
		if !set[n] {
			unknown = append(unknown, n)
		}
	}
	if len(unknown) > 0 {
		sorted := append([]string{}, known...)
		sort.Strings(sorted)
		return NewError(CodeInvalidToolFilter, map[string]any{
			"reason":  fmt.Sprintf("unknown tool(s) %s; known global tools: %s", strings.Join(unknown, ", "), strings.Join(sorted, ", ")),
			"unknown": unknown,
		})
	}
	return nil
}

// Allows reports whether c, a tool ceiling (the intersection of every
// ancestor's filter, a session header's toolCeiling; docs/design.md §7), lets the
// global tool name through: a nil ceiling allows every tool; otherwise name
// must be in Allow when Allow is present, and never in Deny.
func (c *ToolFilter) Allows(name string) bool {
	if c == nil {
		return true
	}
	if c.Allow != nil && !slices.Contains(c.Allow, name) {
		return false
	}
	return !slices.Contains(c.Deny, name)
}
