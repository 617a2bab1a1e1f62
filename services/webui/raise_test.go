package webui

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// raiseAt posts body to the view's raise of session id (with the action
// header when action) and returns the status and the refusal's code.
func raiseAt(t *testing.T, base, id, body string, action bool) (int, protocol.Code, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/api/sessions/"+id+"/budget/raise", strings.NewReader(body))
	if action {
		req.Header.Set(ActionHeader, "1")
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var pe protocol.Error
	_ = json.Unmarshal(raw, &pe)
	return resp.StatusCode, pe.Code, string(raw)
}

// TestTheViewsRaiseRefusesBadInput (docs/protocol.md §5.5, "Pause and
// raise"; issue 32, item 3): the view's raise of a child's budget refuses
// a body that is not one raise (negative, fractional, 1e400, a list,
// nothing, an unknown key, a second value after the first, past 4 KiB),
// a post without the action header, and another user's view, and the
// ledger stays as it was; alice's own raise is taken. An answer's body of
// two values is refused as well.
func TestTheViewsRaiseRefusesBadInput(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	alice, aliceView := userView(t, s, "alice")
	_, bobView := userView(t, s, "bob")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root, err := alice.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: &protocol.Budget{ModelRequests: 10}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = root.Close(context.Background()) })
	st, err := alice.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "capped",
		Prompt: protocol.Text("say hi"), Options: protocol.ContinuableOptions{Budget: &protocol.Budget{ModelRequests: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	limits := func() protocol.Budget {
		rec, err := s.Store.Budget(ctx, st.ChildID)
		if err != nil {
			t.Fatal(err)
		}
		return rec.Value.Limits
	}
	before := limits()
	for _, tt := range []struct {
		name, base, body string
		action           bool
		status           int
		code             protocol.Code
	}{
		{"negative", aliceView, `{"modelRequests":-1}`, true, http.StatusBadRequest, protocol.CodeInvalidArgument},
		{"fractional", aliceView, `{"modelRequests":0.5}`, true, http.StatusBadRequest, protocol.CodeInvalidArgument},
		{"1e400", aliceView, `{"modelRequests":1e400}`, true, http.StatusBadRequest, protocol.CodeInvalidArgument},
		{"a list", aliceView, `[1]`, true, http.StatusBadRequest, protocol.CodeInvalidArgument},
		{"nothing", aliceView, `{}`, true, http.StatusBadRequest, protocol.CodeInvalidArgument},
		{"an empty body", aliceView, ``, true, http.StatusBadRequest, protocol.CodeInvalidArgument},
		{"an unknown key", aliceView, `{"modelRequests":1,"dollars":5}`, true, http.StatusBadRequest, protocol.CodeInvalidArgument},
		{"a second value", aliceView, `{"modelRequests":1}{"modelRequests":8}`, true, http.StatusBadRequest, protocol.CodeInvalidArgument},
		{"past 4 KiB", aliceView, `{"modelRequests":1` + strings.Repeat(" ", 5<<10) + `}`, true, http.StatusBadRequest, protocol.CodeInvalidArgument},
		{"no action header", aliceView, `{"modelRequests":1}`, false, http.StatusForbidden, ""},
		{"another user's view", bobView, `{"modelRequests":1}`, true, http.StatusForbidden, protocol.CodeUnauthorized},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if status, code, raw := raiseAt(t, tt.base, st.ChildID, tt.body, tt.action); status != tt.status || code != tt.code {
				t.Fatalf("raise: %d %s; want %d %q", status, raw, tt.status, tt.code)
			}
		})
	}
	if after := limits(); after != before {
		t.Fatalf("the refused raises changed the limits to %+v, were %+v", after, before)
	}
	if status, _, raw := raiseAt(t, aliceView, st.ChildID, `{"modelRequests":1}`, true); status != http.StatusOK || limits().ModelRequests != 3 {
		t.Fatalf("alice's raise: %d %s; want 200 and the limit 3", status, raw)
	}
	// An answer's body is held to one value too: refused before it
	// reaches the coordinator.
	req, _ := http.NewRequest(http.MethodPost, aliceView+"/api/requests/r0000000000000000000000001/answer", strings.NewReader(`{"answer":"deny"}{"answer":"approve"}`))
	req.Header.Set(ActionHeader, "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var pe protocol.Error
	_ = json.Unmarshal(raw, &pe)
	if resp.StatusCode != http.StatusBadRequest || pe.Code != protocol.CodeInvalidArgument || !strings.Contains(pe.Message, "trailing") {
		t.Fatalf("an answer of two values: %d %s; want 400 INVALID_ARGUMENT saying trailing data", resp.StatusCode, raw)
	}
}
