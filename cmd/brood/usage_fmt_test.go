package main

import (
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/webui"
)

func TestUsageFormats(t *testing.T) {
	u := &protocol.UsageSummary{
		Own:     protocol.RunUsage{InputTokens: 12, OutputTokens: 5, ModelRequests: 3, ToolCalls: 2, WallMs: 1200},
		Subtree: protocol.RunUsage{InputTokens: 40, OutputTokens: 9, ModelRequests: 7, UnreportedRequests: 1, ToolCalls: 4, WallMs: 3400},
	}
	tests := []struct {
		name, got, want string
	}{
		{"line", usageLine(u), "usage: own 12 in + 5 out tokens, 3 model requests, 2 tool calls, 1.2s; " +
			"subtree 40 in + 9 out tokens, 7 model requests, 4 tool calls, 3.4s (at least: the tokens of 1 model request were not reported)"},
		{"one of each, singular", usageLine(&protocol.UsageSummary{
			Own:     protocol.RunUsage{InputTokens: 1, OutputTokens: 1, ModelRequests: 1, ToolCalls: 1, WallMs: 5},
			Subtree: protocol.RunUsage{ModelRequests: 2, UnreportedRequests: 2, WallMs: 5}}),
			"usage: own 1 in + 1 out tokens, 1 model request, 1 tool call, 5ms; " +
				"subtree 0 in + 0 out tokens, 2 model requests, 0 tool calls, 5ms (at least: the tokens of 2 model requests were not reported)"},
		{"no usage, no line", usageLine(nil), ""},
		{"cells", strings.Join(cells(usageCells(u)), " "), "17/49+? 3/7"},
		{"no usage, dashes", strings.Join(cells(usageCells(nil)), " "), "- -"},
		{"watch tree", nodeLine(webui.Node{ID: "c1", Provider: "spawn", State: webui.StateSettled, StopReason: "completed", Usage: u}, time.Now()),
			"c1  spawn  completed  tokens 17/49+?  requests 3/7"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s:\n got %q\nwant %q", tt.name, tt.got, tt.want)
		}
	}
}

func cells(a, b string) []string { return []string{a, b} }
