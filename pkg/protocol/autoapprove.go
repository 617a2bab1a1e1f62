package protocol

import (
	"slices"
	"sort"
	"strings"
)

// ResolveAutoApprove decides a child's SessionHeader.AutoApprove, the tools
// it runs without asking for approval (docs/protocol.md §5.5, autoApprove),
// from its parent's header, the start's autoApprove option (nil when
// absent) and the provider's global tools (ProviderDescriptor.Tools). The
// rule tightens down the tree as the tool ceiling does:
//   - a parent that speaks for the user (a client's root, PromptSource) may
//     allow any of the provider's tools; absent, the child asks for each;
//   - any other parent (an agent) passes on its own set when the option is
//     absent, and may only narrow it: a child is never allowed outright a
//     tool its parent must ask for.
//
// An unknown name, or one the parent may not pass on, is INVALID_ARGUMENT.
// The result is sorted and without repeats; nil means none.
func ResolveAutoApprove(parent SessionHeader, requested, known []string) ([]string, error) {
	user := PromptSource(parent).Kind == SourceUser
	if requested == nil {
		if user {
			return nil, nil
		}
		return normalizeNames(parent.AutoApprove), nil
	}
	for _, n := range requested {
		if !slices.Contains(known, n) {
			sorted := slices.Clone(known)
			sort.Strings(sorted)
			return nil, Errorf(CodeInvalidArgument, "autoApprove: unknown tool %q; the provider's global tools: %s", n, strings.Join(sorted, ", "))
		}
		if !user && !slices.Contains(parent.AutoApprove, n) {
			return nil, Errorf(CodeInvalidArgument, "autoApprove: tool %s needs approval in the parent session %s; a child is never allowed outright a tool its parent must ask for", n, parent.ID)
		}
	}
	return normalizeNames(requested), nil
}

// normalizeNames sorts names and drops repeats; empty is nil.
func normalizeNames(names []string) []string {
	if len(names) == 0 {
		return nil
	}
	out := slices.Clone(names)
	sort.Strings(out)
	return slices.Compact(out)
}

// AutoApproves reports whether the session runs the tool name without
// asking (its header's autoApprove lists it).
func (h SessionHeader) AutoApproves(name string) bool { return slices.Contains(h.AutoApprove, name) }
