package main

import (
	"fmt"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// usageLine is a result's usage as `brood run` and `brood result` print it
// on stderr (docs/protocol.md §6.6), "" when the result carries none:
//
//	usage: own 12 in + 5 out tokens, 3 model requests, 2 tool calls, 1.2s; subtree 40 in + 9 out tokens, ...
func usageLine(u *protocol.UsageSummary) string {
	if u == nil {
		return ""
	}
	return "usage: own " + usageText(u.Own) + "; subtree " + usageText(u.Subtree)
}

func usageText(u protocol.RunUsage) string {
	s := fmt.Sprintf("%d in + %d out tokens, %s, %s, %s",
		u.InputTokens, u.OutputTokens, count(u.ModelRequests, "model request"), count(u.ToolCalls, "tool call"),
		elapsed(time.Duration(u.WallMs)*time.Millisecond))
	if u.UnreportedRequests > 0 {
		s += fmt.Sprintf(" (at least: the tokens of %s were not reported)", count(u.UnreportedRequests, "model request"))
	}
	return s
}

// count is n and noun, plural unless n is 1: "1 tool call", "0 tool calls".
func count[N ~int | ~int64](n N, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// usageCells are a table's TOKENS and REQUESTS cells, own/subtree: total
// tokens (in + out; "+?" after a figure that is a lower bound, some
// requests' tokens unreported) and model requests; "-" without usage.
func usageCells(u *protocol.UsageSummary) (tokens, requests string) {
	if u == nil {
		return "-", "-"
	}
	tok := func(r protocol.RunUsage) string {
		s := fmt.Sprint(r.Tokens())
		if r.UnreportedRequests > 0 {
			s += "+?"
		}
		return s
	}
	return tok(u.Own) + "/" + tok(u.Subtree), fmt.Sprintf("%d/%d", u.Own.ModelRequests, u.Subtree.ModelRequests)
}
