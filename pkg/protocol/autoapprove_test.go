package protocol

import (
	"slices"
	"strings"
	"testing"
)

// TestResolveAutoApprove (issue 33, item 3): a user's start may allow any
// of the provider's tools outright and allows none by default; below an
// agent the set is inherited and may only narrow.
func TestResolveAutoApprove(t *testing.T) {
	known := []string{"list_dir", "read_file", "write_file", "edit_file", "run_command"}
	userRoot := SessionHeader{ID: "R"}
	acpRoot := SessionHeader{ID: "E", Origin: OriginReopenable}
	agent := SessionHeader{ID: "A", ParentSession: "R", Origin: OriginSubagent, AutoApprove: []string{"edit_file", "write_file"}}
	tests := []struct {
		name      string
		parent    SessionHeader
		requested []string
		want      []string
		err       string
	}{
		{"a user's start, absent: none", userRoot, nil, nil, ""},
		{"a user's start allows any", userRoot, []string{"run_command", "write_file", "run_command"}, []string{"run_command", "write_file"}, ""},
		{"a user's start, empty", userRoot, []string{}, nil, ""},
		{"an unknown tool", userRoot, []string{"rm_rf"}, nil, `unknown tool "rm_rf"`},
		{"an agent's start, absent: inherited", agent, nil, []string{"edit_file", "write_file"}, ""},
		{"an agent's start narrows", agent, []string{"write_file"}, []string{"write_file"}, ""},
		{"an agent's start never widens", agent, []string{"run_command"}, nil, "needs approval in the parent session A"},
		{"an ACP agent's root is an agent", acpRoot, []string{"write_file"}, nil, "needs approval in the parent session E"},
		{"an ACP agent's root passes on nothing", acpRoot, nil, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ResolveAutoApprove(tt.parent, tt.requested, known)
			if tt.err != "" {
				if CodeOf(err) != CodeInvalidArgument || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ResolveAutoApprove = %v, %v; want INVALID_ARGUMENT containing %q", got, err, tt.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("ResolveAutoApprove = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

// TestResolveApproval (issue 33, item 2(a)): approveTools is the union of
// the start's, the parent's and the provider's, so it only grows down the
// tree whoever starts the child; a tool in it is never allowed outright.
func TestResolveApproval(t *testing.T) {
	desc := ProviderDescriptor{Name: "spawn", Tools: []string{"list_dir", "read_file", "write_file", "edit_file", "run_command", "subagent", "docs__search"}}
	guarded := desc
	guarded.ApproveTools = []string{"docs__search"}
	userRoot := SessionHeader{ID: "R"}
	agent := SessionHeader{ID: "A", ParentSession: "R", Origin: OriginSubagent, AutoApprove: []string{"run_command", "write_file"}, ApproveTools: []string{"read_file"}}
	tests := []struct {
		name        string
		parent      SessionHeader
		desc        ProviderDescriptor
		auto, asks  []string // the start's options (nil: absent)
		wantAuto    []string
		wantApprove []string
		err         string
	}{
		{"none anywhere", userRoot, desc, nil, nil, nil, nil, ""},
		{"a user's start adds", userRoot, desc, nil, []string{"subagent", "read_file", "subagent"}, nil, []string{"read_file", "subagent"}, ""},
		{"the provider's always apply", userRoot, guarded, nil, nil, nil, []string{"docs__search"}, ""},
		{"start and provider together", userRoot, guarded, nil, []string{"read_file"}, nil, []string{"docs__search", "read_file"}, ""},
		{"an agent's child inherits", agent, desc, nil, nil, []string{"run_command", "write_file"}, []string{"read_file"}, ""},
		{"an agent's start adds, never removes", agent, desc, nil, []string{"list_dir"}, []string{"run_command", "write_file"}, []string{"list_dir", "read_file"}, ""},
		{"an empty option removes nothing", agent, desc, nil, []string{}, []string{"run_command", "write_file"}, []string{"read_file"}, ""},
		{"an inherited autoApprove loses what is added", agent, desc, nil, []string{"write_file"}, []string{"run_command"}, []string{"read_file", "write_file"}, ""},
		{"all of an inherited autoApprove lost", agent, desc, nil, []string{"write_file", "run_command"}, nil, []string{"read_file", "run_command", "write_file"}, ""},
		{"a tool named in both is refused", userRoot, desc, []string{"write_file"}, []string{"write_file"}, nil, nil, "tool write_file must ask for approval"},
		{"allowed outright what the provider guards is refused", userRoot, guarded, []string{"docs__search"}, nil, nil, nil, "tool docs__search must ask for approval"},
		{"an unknown tool is refused", userRoot, desc, nil, []string{"rm_rf"}, nil, nil, `approveTools: unknown tool "rm_rf"`},
		{"autoApprove's own rules still hold", agent, desc, []string{"edit_file"}, nil, nil, nil, "needs approval in the parent session A"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			auto, approve, err := ResolveApproval(tt.parent, tt.auto, tt.asks, tt.desc)
			if tt.err != "" {
				if CodeOf(err) != CodeInvalidArgument || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ResolveApproval = %v, %v, %v; want INVALID_ARGUMENT containing %q", auto, approve, err, tt.err)
				}
				return
			}
			if err != nil || !slices.Equal(auto, tt.wantAuto) || !slices.Equal(approve, tt.wantApprove) {
				t.Fatalf("ResolveApproval = auto %v, approve %v, %v; want auto %v, approve %v", auto, approve, err, tt.wantAuto, tt.wantApprove)
			}
			h := SessionHeader{AutoApprove: auto, ApproveTools: approve}
			for _, n := range approve {
				if !h.Asks(n, false) || !h.Asks(n, true) {
					t.Fatalf("%s is in approveTools %v, yet the header does not ask for it", n, approve)
				}
			}
			for _, n := range auto {
				if h.Asks(n, true) {
					t.Fatalf("%s is allowed outright (%v), yet the header asks for it", n, auto)
				}
			}
		})
	}
	if h := (SessionHeader{}); !h.Asks("write_file", true) || h.Asks("read_file", false) {
		t.Fatal("a header with neither set asks for the tools that ask by default and only those")
	}
}
