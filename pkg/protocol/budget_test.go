package protocol

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseBudget(t *testing.T) {
	tests := []struct {
		in    string
		want  Budget
		field string // "" when it parses
	}{
		{"tokens=200k,children=20,deadline=15m", Budget{Tokens: 200_000, Children: 20, DeadlineMs: 900_000}, ""},
		{"requests=3, tools=4", Budget{ModelRequests: 3, ToolCalls: 4}, ""},
		{"tokens=2M,deadline=1500", Budget{Tokens: 2_000_000, DeadlineMs: 1500}, ""},
		{"deadline=5000ms", Budget{DeadlineMs: 5000}, ""},
		{"tokens=-1", Budget{}, "tokens"},
		{"tokens=1.5", Budget{}, "tokens"},
		{"tokens=NaN", Budget{}, "tokens"},
		{"tokens=9007199254740992", Budget{}, "tokens"},
		{"tokenz=5", Budget{}, "tokenz"},
		{"tokens=5,tokens=6", Budget{}, "twice"},
		{"tokens", Budget{}, "name=value"},
		{"", Budget{}, "--budget: names no limit"},
		{" , ", Budget{}, "--budget: names no limit"},
		// A deadline's error says what a deadline is, not a count's "whole
		// number", and its bound in the unit it was given in.
		{"deadline=31d", Budget{}, "deadline=31d: want a duration (15m, 1h30m) or whole milliseconds"},
		{"deadline=banana", Budget{}, "want a duration"},
		{"deadline=800h", Budget{}, "deadline=800h: a deadline is at most 720h0m0s"},
		{"deadline=2592000001", Budget{}, "at most 720h0m0s"},
		{"deadline=99999999999999999999", Budget{}, "want a duration"},
		{"deadline=720h", Budget{DeadlineMs: BudgetDeadlineMsMax}, ""},
		{"deadline=0", Budget{}, "at least 1ms"},
		{"deadline=-5", Budget{}, "at least 1ms"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseBudget(tt.in)
			if tt.field == "" {
				if err != nil || got != tt.want {
					t.Fatalf("ParseBudget = %+v, %v; want %+v", got, err, tt.want)
				}
				if back, err := ParseBudget(got.String()); err != nil || back != got {
					t.Fatalf("String %q parses back to %+v, %v", got.String(), back, err)
				}
				return
			}
			if CodeOf(err) != CodeInvalidArgument || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("ParseBudget(%q) = %v, want INVALID_ARGUMENT naming %q", tt.in, err, tt.field)
			}
		})
	}
}

func TestBudgetLedger(t *testing.T) {
	rec := BudgetRecord{SessionID: "r", Limits: Budget{Tokens: 100, ToolCalls: 2}, Charged: BudgetSpend{Tokens: 60, ToolCalls: 1},
		Reservations: []BudgetReservation{{ID: "a", Spend: BudgetSpend{Tokens: 30}}}}
	if rem := rec.Remaining(); rem.Tokens != 10 || rem.ToolCalls != 1 || rem.ModelRequests != math.MaxInt64 {
		t.Fatalf("remaining %+v", rem)
	}
	if err := rec.Exhausted(BudgetSpend{Tokens: 50}, 10, 0); err != nil {
		t.Fatalf("10 free tokens cover a minimum of 10: %v", err)
	}
	err := rec.Exhausted(BudgetSpend{Tokens: 50}, 11, 0)
	if e, ok := err.(*Error); !ok || e.Code != CodeBudgetExhausted || e.Details["limit"] != BudgetLimitTokens || e.Details["usage"] != int64(90) {
		t.Fatalf("exhausted = %v", err)
	}
	if err := rec.Exhausted(BudgetSpend{ToolCalls: 2}, 0, 0); CodeOf(err) != CodeBudgetExhausted {
		t.Fatalf("two tool calls with one left: %v", err)
	}
	dl := BudgetRecord{SessionID: "r", Limits: Budget{DeadlineMs: 10}, DeadlineAt: 110, CreatedAt: 100}
	if err := dl.Exhausted(BudgetSpend{ToolCalls: 1}, 0, 110); CodeOf(err) != CodeBudgetExhausted {
		t.Fatalf("past the deadline: %v", err)
	}
	rem, deadline := BudgetRemainder([]BudgetRecord{rec, dl})
	if rem.Tokens != 10 || deadline != 110 {
		t.Fatalf("remainder %+v, %d", rem, deadline)
	}
	if err := (Budget{Tokens: 11}).WithinRemainder(rem, deadline, 100); CodeOf(err) != CodeLimitExceeded {
		t.Fatalf("11 tokens of 10 left: %v", err)
	}
	if err := (Budget{Tokens: 10, DeadlineMs: 10}).WithinRemainder(rem, deadline, 100); err != nil {
		t.Fatalf("within: %v", err)
	}
}

// TestParseBudgetRaise: `brood budget --raise` takes name=+amount pairs
// (k and M suffixes); a negative, zero, fractional, past 2^53−1, unknown
// or deadline amount, a pair without =, nothing, and one limit named twice
// (under either of its names: the second would silently replace the first)
// are INVALID_ARGUMENT.
func TestParseBudgetRaise(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want BudgetSpend
		ok   bool
	}{
		{"tokens=+100k", BudgetSpend{Tokens: 100_000}, true},
		{"requests=+2, tools=+3,children=+1", BudgetSpend{ModelRequests: 2, ToolCalls: 3, Children: 1}, true},
		{"tokens=5", BudgetSpend{Tokens: 5}, true},
		{"tokens=+-5", BudgetSpend{}, false},
		{"tokens=+0", BudgetSpend{}, false},
		{"tokens=+1.5", BudgetSpend{}, false},
		{"tokens=+9007199254741k", BudgetSpend{}, false},
		{"tokens=+99999999999999999999", BudgetSpend{}, false},
		{"dollars=+5", BudgetSpend{}, false},
		{"deadline=+5m", BudgetSpend{}, false},
		{"tokens", BudgetSpend{}, false},
		{"", BudgetSpend{}, false},
		{"tokens=+5,", BudgetSpend{}, false},
		{"tokens=+5,tokens=+7", BudgetSpend{}, false},
		{"requests=+1,modelRequests=+2", BudgetSpend{}, false},
	} {
		got, err := ParseBudgetRaise(tt.in)
		if tt.ok && (err != nil || got != tt.want) {
			t.Errorf("ParseBudgetRaise(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
		if !tt.ok && CodeOf(err) != CodeInvalidArgument {
			t.Errorf("ParseBudgetRaise(%q) = %+v, %v; want INVALID_ARGUMENT", tt.in, got, err)
		}
	}
}

// TestBudgetExhaustedSaysWhatIsLeft (issue 32): a refusal with some of
// the limit left says what the next step needed and what remains, not
// that the limit is reached; one with nothing left says it is reached.
// Either names the ledger's raise count.
func TestBudgetExhaustedSaysWhatIsLeft(t *testing.T) {
	rec := BudgetRecord{SessionID: "b", Limits: Budget{Tokens: 12, ToolCalls: 3, ModelRequests: 2}, Raises: 2,
		Charged: BudgetSpend{Tokens: 7, ToolCalls: 1, ModelRequests: 2}}
	for _, tt := range []struct {
		name      string
		want      BudgetSpend
		minTokens int64
		message   string
		needed    int64
	}{
		{"tokens short", BudgetSpend{Tokens: 20}, 8, "the budget of b is short: the next step needs at least 8 tokens of its tokens limit; 5 of 12 tokens are left (7 used)", 8},
		{"tool calls short", BudgetSpend{ToolCalls: 3}, 0, "the budget of b is short: the next step needs 3 tool calls of its toolCalls limit; 2 of 3 tool calls are left (1 used)", 3},
		{"model requests reached", BudgetSpend{ModelRequests: 1}, 0, "the budget of b is spent: its modelRequests limit of 2 model requests is reached (2 used)", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var e *Error
			if !errors.As(rec.Exhausted(tt.want, tt.minTokens, 0), &e) || e.Code != CodeBudgetExhausted {
				t.Fatalf("want BUDGET_EXHAUSTED, got %v", e)
			}
			if !strings.HasPrefix(e.Message, tt.message+"; ") || e.Details["raises"] != int64(2) || e.Details["needed"] != tt.needed {
				t.Fatalf("message %q, details %v; want %q, raises 2, needed %d", e.Message, e.Details, tt.message, tt.needed)
			}
		})
	}
}
