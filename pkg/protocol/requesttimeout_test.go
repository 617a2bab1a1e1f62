package protocol

import (
	"strings"
	"testing"
	"time"
)

// TestResolveRequestTimeout (issue 33, item 5): a start's requestTimeoutMs
// is a positive number of milliseconds up to RequestTimeoutMsMax, only
// tightens its parent's, and absent inherits it; the header's is the
// requests' wait, else the coordinator's default.
func TestResolveRequestTimeout(t *testing.T) {
	root := SessionHeader{ID: "R"}
	tight := SessionHeader{ID: "A", RequestTimeoutMs: 60_000}
	tests := []struct {
		name      string
		parent    SessionHeader
		requested int64
		want      int64
		code      Code
	}{
		{"absent under none: the default", root, 0, 0, ""},
		{"absent inherits the parent's", tight, 0, 60_000, ""},
		{"set under none", root, 1500, 1500, ""},
		{"the maximum under none", root, RequestTimeoutMsMax, RequestTimeoutMsMax, ""},
		{"tighter than the parent's", tight, 1000, 1000, ""},
		{"equal to the parent's", tight, 60_000, 60_000, ""},
		{"above the parent's", tight, 60_001, 0, CodeInvalidArgument},
		{"negative", root, -1, 0, CodeInvalidArgument},
		{"above the maximum", root, RequestTimeoutMsMax + 1, 0, CodeLimitExceeded},
		{"above the maximum under a parent", tight, RequestTimeoutMsMax + 1, 0, CodeLimitExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ResolveRequestTimeout(tt.parent, tt.requested)
			if tt.code != "" {
				pe := AsError(err)
				if CodeOf(err) != tt.code || pe.Details["limit"] != "requestTimeoutMs" || !strings.Contains(pe.Message, "milliseconds") {
					t.Fatalf("ResolveRequestTimeout(%d) = %d, %v; want %s naming requestTimeoutMs", tt.requested, got, err, tt.code)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ResolveRequestTimeout(%d) = %d, %v; want %d", tt.requested, got, err, tt.want)
			}
			h := SessionHeader{RequestTimeoutMs: got}
			want := 5 * time.Minute
			if got > 0 {
				want = time.Duration(got) * time.Millisecond
			}
			if d := h.RequestTimeout(5 * time.Minute); d != want {
				t.Fatalf("RequestTimeout = %s, want %s", d, want)
			}
		})
	}
}
