package protocol

import (
	"errors"
	"testing"
)

func TestToolFilterAllows(t *testing.T) {
	for _, tt := range []struct {
		name    string
		ceiling *ToolFilter
		tool    string
		want    bool
	}{
		{"no ceiling", nil, "read_file", true},
		{"allowed", &ToolFilter{Allow: []string{"read_file"}}, "read_file", true},
		{"not in allow", &ToolFilter{Allow: []string{"read_file"}}, "list_dir", false},
		{"empty allow hides all", &ToolFilter{Allow: []string{}}, "read_file", false},
		{"denied", &ToolFilter{Deny: []string{"subagent"}}, "subagent", false},
		{"deny only", &ToolFilter{Deny: []string{"subagent"}}, "read_file", true},
		{"allowed then denied", &ToolFilter{Allow: []string{"subagent"}, Deny: []string{"subagent"}}, "subagent", false},
	} {
		if got := tt.ceiling.Allows(tt.tool); got != tt.want {
			t.Errorf("%s: Allows(%s) = %v, want %v", tt.name, tt.tool, got, tt.want)
		}
	}
}

func TestValidateToolFilter(t *testing.T) {
	known := []string{"read_file", "list_dir"}
	for _, tt := range []struct {
		name   string
		filter ToolFilter
		ok     bool
	}{
		{"allow known", ToolFilter{Allow: []string{"read_file"}}, true},
		{"deny known", ToolFilter{Deny: []string{"list_dir"}}, true},
		{"empty allow", ToolFilter{Allow: []string{}}, true},
		{"neither", ToolFilter{}, false},
		{"unknown", ToolFilter{Allow: []string{"write_file"}}, false},
	} {
		err := ValidateToolFilter(tt.filter, known)
		if (err == nil) != tt.ok {
			t.Errorf("%s: ValidateToolFilter = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidToolFilter) {
			t.Errorf("%s: %v is not INVALID_TOOL_FILTER", tt.name, err)
		}
	}
}
