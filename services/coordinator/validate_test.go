package coordinator

import (
	"reflect"
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

func TestCeilingsOnlyNarrow(t *testing.T) {
	desc := protocol.ProviderDescriptor{Name: "spawn", Tools: []string{"list_dir", "read_file", "subagent"}}
	parent := &protocol.ToolFilter{Allow: []string{"list_dir", "subagent"}}
	tests := []struct {
		name    string
		filter  protocol.ToolFilter
		wantErr bool
		want    *protocol.ToolFilter
	}{
		{"deny narrows", protocol.ToolFilter{Deny: []string{"subagent"}}, false, &protocol.ToolFilter{Allow: []string{"list_dir", "subagent"}, Deny: []string{"subagent"}}},
		{"allow within the ceiling", protocol.ToolFilter{Allow: []string{"list_dir"}}, false, &protocol.ToolFilter{Allow: []string{"list_dir"}}},
		{"allow outside the ceiling", protocol.ToolFilter{Allow: []string{"read_file"}}, true, nil},
		{"unknown name", protocol.ToolFilter{Deny: []string{"rm"}}, true, nil},
		{"empty filter", protocol.ToolFilter{}, true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkToolFilter(desc, parent, tt.filter)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v", err)
			}
			if err != nil {
				if protocol.CodeOf(err) != protocol.CodeInvalidToolFilter {
					t.Fatalf("code = %s", protocol.CodeOf(err))
				}
				return
			}
			if got := intersectCeiling(parent, &tt.filter); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ceiling = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestDepthCapNeverWidens(t *testing.T) {
	three, one := int64(3), int64(1)
	tests := []struct {
		parentDepth int64
		parentCap   *int64
		maxDepth    *int64
		wantCap     *int64
		wantErr     bool
	}{
		{0, nil, nil, nil, false},
		{0, nil, &three, &three, false},
		{1, &three, ptr(int64(10)), &three, false}, // asking for more keeps the narrower cap
		{1, &three, &one, nil, true},               // depth 2 > 1
		{3, &three, nil, nil, true},                // depth 4 > inherited 3
		{2, &three, nil, &three, false},            // depth 3 = inherited 3: at the cap is allowed
		{0, nil, &one, &one, false},                // depth 1 = maxDepth 1
	}
	for _, tt := range tests {
		_, cap, err := resolveDepth(protocol.SessionHeader{DelegationDepth: tt.parentDepth, DepthCap: tt.parentCap}, tt.maxDepth)
		if (err != nil) != tt.wantErr {
			t.Fatalf("%+v: err = %v", tt, err)
		}
		if err == nil && !reflect.DeepEqual(cap, tt.wantCap) {
			t.Fatalf("%+v: cap = %v", tt, cap)
		}
		if err != nil && protocol.CodeOf(err) != protocol.CodeDepthExceeded {
			t.Fatalf("code = %s", protocol.CodeOf(err))
		}
	}
}

func ptr[T any](v T) *T { return &v }
