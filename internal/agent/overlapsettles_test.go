package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/pkg/protocol"
)

// grantingBudget is a Budgeter that grants every want and records the
// reservations and their settlements.
type grantingBudget struct {
	mu      sync.Mutex
	wants   []protocol.BudgetSpend          // by reservation, r1 first
	settled map[string]protocol.BudgetSpend // by reservation id
	settles int
}

func (b *grantingBudget) ReserveBudget(_ context.Context, req protocol.BudgetReserveRequest) (protocol.BudgetReserveReply, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.wants = append(b.wants, req.Want)
	return protocol.BudgetReserveReply{ReservationID: fmt.Sprintf("r%d", len(b.wants)), Granted: req.Want}, nil
}

func (b *grantingBudget) SettleBudget(_ context.Context, req protocol.BudgetSettleRequest) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.settles++
	b.settled[req.ReservationID] = req.Used
	return nil
}

// lastModel is the id of the last model request's reservation.
func (b *grantingBudget) lastModel() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := len(b.wants) - 1; i >= 0; i-- {
		if b.wants[i].ModelRequests == 1 {
			return fmt.Sprintf("r%d", i+1)
		}
	}
	return ""
}

func (b *grantingBudget) settledOf(id string) (protocol.BudgetSpend, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	u, ok := b.settled[id]
	return u, ok
}

// TestOverlapSettlesHoldsTheLastSettlementForItsHost (docs/protocol.md
// §5.5, "Budgets"): a turn settles each reservation once, with what the
// step used. By default the turn returns once its settlements are done;
// with OverlapSettles (the one-shot host) it returns before the
// settlement of the step that ended it is sent, and WaitSettled sends it
// and waits for every one.
func TestOverlapSettlesHoldsTheLastSettlementForItsHost(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, overlap := range []bool{false, true} {
		t.Run(fmt.Sprintf("overlap=%v", overlap), func(t *testing.T) {
			budget := &grantingBudget{settled: map[string]protocol.BudgetSpend{}}
			reg, err := NewRegistry(ListDirTool(AnyWorkspace))
			if err != nil {
				t.Fatal(err)
			}
			a, err := New(Config{Header: protocol.SessionHeader{ID: "S1", Cwd: dir, Budgets: []string{"S0"}},
				Log: &memLog{}, Model: model.NewScripted(), Tools: reg, Budget: budget, Credential: "c"})
			if err != nil {
				t.Fatal(err)
			}
			if overlap {
				a.OverlapSettles()
			}
			out := a.RunTurn(context.Background(), userInput("call list_dir {}\nsay done"))
			if out.Err != nil || out.Reason.Kind != protocol.TurnCompleted {
				t.Fatalf("outcome %+v", out)
			}
			last := budget.lastModel()
			if _, sent := budget.settledOf(last); sent == overlap {
				t.Fatalf("the last step's settlement sent when the turn returned: %v; want %v", sent, !overlap)
			}
			a.WaitSettled()
			budget.mu.Lock()
			n, settles := len(budget.wants), budget.settles
			budget.mu.Unlock()
			if n != 3 || settles != 3 {
				t.Fatalf("%d reservations, %d settlements; want 3 (two model requests, one tool call) settled once each", n, settles)
			}
			if u, _ := budget.settledOf(last); u.ModelRequests != 1 || u.Tokens <= 0 || u.Tokens >= budget.wants[2].Tokens {
				t.Fatalf("the last step settled %+v of its grant %+v; want one request and the tokens it used", u, budget.wants[2])
			}
		})
	}
}
