package agent

import (
	"math"
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// TestModelUsedStaysWithinTheLedgersBounds (docs/protocol.md §5.5,
// "Budgets"): what a model request's settle charges is a whole number from
// 0 to BudgetValueMax, which budget.settle accepts, whatever the model
// reported: a report past 2^53−1 (or whose sum overflows int64) charges
// BudgetValueMax, exhausting the budget, instead of a settle refused
// INVALID_ARGUMENT that left only the grant charged; a negative count is
// no report (the grant is charged), never a credit.
func TestModelUsedStaysWithinTheLedgersBounds(t *testing.T) {
	g := grant{id: "r1", tokens: 500}
	for _, tt := range []struct {
		name  string
		usage *protocol.Usage
		want  int64
	}{
		{"as reported", &protocol.Usage{InputTokens: 100, OutputTokens: 20}, 120},
		{"none", nil, 500},
		{"unknown", &protocol.Usage{InputTokens: 100, Unknown: true}, 500},
		{"past the bound", &protocol.Usage{InputTokens: protocol.BudgetValueMax, OutputTokens: 1}, protocol.BudgetValueMax},
		{"an output past the bound", &protocol.Usage{OutputTokens: 1 << 60}, protocol.BudgetValueMax},
		{"the bound exactly", &protocol.Usage{InputTokens: protocol.BudgetValueMax - 7, OutputTokens: 7}, protocol.BudgetValueMax},
		{"a sum that overflows", &protocol.Usage{InputTokens: math.MaxInt64, OutputTokens: math.MaxInt64}, protocol.BudgetValueMax},
		{"a negative input", &protocol.Usage{InputTokens: -1000, OutputTokens: 1600}, 500},
		{"a negative output", &protocol.Usage{InputTokens: 10, OutputTokens: math.MinInt64}, 500},
	} {
		t.Run(tt.name, func(t *testing.T) {
			used := modelUsed(g, tt.usage)
			if used.Tokens != tt.want || used.ModelRequests != 1 {
				t.Fatalf("modelUsed = %+v; want %d tokens and one request", used, tt.want)
			}
		})
	}
}
