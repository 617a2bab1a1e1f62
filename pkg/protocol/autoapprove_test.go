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
