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

// ResolveApproveTools decides a child's SessionHeader.ApproveTools, the
// further tools it asks approval for before each call (docs/protocol.md
// §5.5, approveTools), from its parent's header, the start's approveTools
// option (nil when absent) and the provider's descriptor: the union of the
// parent's set, the option's and the descriptor's ApproveTools, so it only
// grows down the tree (a child asks for at least what its parent asks
// for, whoever starts it). Each name the option gives must be one of the
// descriptor's tools, else INVALID_ARGUMENT. The result is sorted and
// without repeats; nil means none.
func ResolveApproveTools(parent SessionHeader, requested []string, desc ProviderDescriptor) ([]string, error) {
	for _, n := range requested {
		if !desc.HasTool(n) {
			sorted := slices.Clone(desc.Tools)
			sort.Strings(sorted)
			return nil, Errorf(CodeInvalidArgument, "approveTools: unknown tool %q; the provider's global tools: %s", n, strings.Join(sorted, ", "))
		}
	}
	return normalizeNames(slices.Concat(parent.ApproveTools, requested, desc.ApproveTools)), nil
}

// ResolveApproval resolves a child's autoApprove (ResolveAutoApprove) and
// approveTools (ResolveApproveTools) together: a tool the child must ask
// for is never also allowed outright. A start that names one tool in both
// is INVALID_ARGUMENT; a set inherited from an agent parent loses the
// tools the child's approveTools adds (the stricter wins).
func ResolveApproval(parent SessionHeader, autoApprove, approveTools []string, desc ProviderDescriptor) (auto, approve []string, err error) {
	if approve, err = ResolveApproveTools(parent, approveTools, desc); err != nil {
		return nil, nil, err
	}
	if auto, err = ResolveAutoApprove(parent, autoApprove, desc.Tools); err != nil {
		return nil, nil, err
	}
	for _, n := range auto {
		if slices.Contains(approve, n) && autoApprove != nil {
			return nil, nil, Errorf(CodeInvalidArgument, "autoApprove: tool %s must ask for approval in this child (approveTools, from the start, its parent or its provider); a tool is never both", n)
		}
	}
	auto = slices.DeleteFunc(auto, func(n string) bool { return slices.Contains(approve, n) })
	if len(auto) == 0 {
		auto = nil
	}
	return auto, approve, nil
}

// Asks reports whether the session asks approval before a call of tool
// name: a tool its header's approveTools names always asks; a tool that
// asks by default (approval: the built-in write tools, write_file,
// edit_file and run_command) asks unless autoApprove names it
// (docs/protocol.md §5.5, §9.1).
func (h SessionHeader) Asks(name string, approval bool) bool {
	return slices.Contains(h.ApproveTools, name) || approval && !h.AutoApproves(name)
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
