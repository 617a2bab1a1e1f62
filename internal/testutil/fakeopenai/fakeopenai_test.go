package fakeopenai

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func post(t *testing.T, s *Server, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.URL+"/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+Key)
	res, err := s.HTTPClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestStrictChecks: each rule refuses the request that breaks it, with
// HTTP 400 and a recorded reason, and a well-formed conversation passes.
func TestStrictChecks(t *testing.T) {
	const (
		user  = `{"role":"user","content":"hi"}`
		callA = `{"role":"assistant","content":null,"tool_calls":[{"id":"A","type":"function","function":{"name":"f","arguments":"{}"}}]}`
		resA  = `{"role":"tool","tool_call_id":"A","content":"ok"}`
	)
	conv := func(thinking string, msgs ...string) string {
		return `{"model":"m","stream":true` + thinking + `,"messages":[` + strings.Join(msgs, ",") + `]}`
	}
	tests := []struct {
		name     string
		thinking bool
		body     string
		want     string // "" accepted, else a part of the reason
	}{
		{"well-formed", false, conv("", user, callA, resA, `{"role":"assistant","content":"done"}`, user), ""},
		{"not JSON", false, `{"model":`, "not valid JSON"},
		{"not streamed", false, `{"model":"m","messages":[` + user + `]}`, "stream: true"},
		{"call without result", false, conv("", user, callA), "not followed by tool messages for: A"},
		{"call followed by a user message", false, conv("", user, callA, user), "must be followed by tool messages"},
		{"result without call", false, conv("", user, `{"role":"tool","tool_call_id":"X","content":"ok"}`), "has no pending call"},
		{"result twice", false, conv("", user, callA, resA, resA), "has no pending call"},
		{"invalid argument JSON", false, conv("", user,
			`{"role":"assistant","tool_calls":[{"id":"A","type":"function","function":{"name":"f","arguments":"{\"p\":"}}]}`, resA), "arguments must be a JSON object"},
		{"arguments not an object", false, conv("", user,
			`{"role":"assistant","tool_calls":[{"id":"A","type":"function","function":{"name":"f","arguments":"[]"}}]}`, resA), "arguments must be a JSON object"},
		{"duplicate ids across messages", false, conv("", user, callA, resA, callA, resA), `duplicate tool_call id "A"`},
		{"duplicate ids in one message", false, conv("", user,
			`{"role":"assistant","tool_calls":[{"id":"A","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"A","type":"function","function":{"name":"g","arguments":"{}"}}]}`, resA, resA),
			`duplicate tool_call id "A"`},
		{"thinking: reasoning_content missing", true, conv("", user, callA, resA), "Missing `reasoning_content` field in the assistant message at message index 1"},
		{"thinking: empty reasoning_content is enough", true, conv("", user,
			`{"role":"assistant","reasoning_content":"","tool_calls":[{"id":"A","type":"function","function":{"name":"f","arguments":"{}"}}]}`, resA), ""},
		{"assistant without content or calls", false, conv("", user, `{"role":"assistant"}`, user), "needs content or tool_calls"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(t, Config{Thinking: tt.thinking}, Say("fine"))
			code, body := post(t, s, tt.body)
			rej := s.Rejections()
			if tt.want == "" {
				if code != http.StatusOK || len(rej) != 0 || !strings.Contains(body, `"content":"fine"`) {
					t.Fatalf("status %d rejections %q body %s", code, rej, body)
				}
				return
			}
			var e struct {
				Error struct{ Message string } `json:"error"`
			}
			_ = json.Unmarshal([]byte(body), &e)
			if code != http.StatusBadRequest || len(rej) != 1 || !strings.Contains(rej[0], tt.want) || e.Error.Message != rej[0] {
				t.Fatalf("status %d rejections %q body %s; want 400 with %q", code, rej, body, tt.want)
			}
		})
	}
}

func TestRepliesStreamInOrder(t *testing.T) {
	r := ""
	s := New(t, Config{}, Reply{Reasoning: &r, Calls: []Call{{"A", "f", "{}"}, {"B", "g", `{"x":1}`}}, SameIndex: true}, Say("two"))
	_, first := post(t, s, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	for _, want := range []string{`"reasoning_content":""`, `"index":0,"type":"function"`, `"id":"B"`, `"finish_reason":"tool_calls"`, "data: [DONE]"} {
		if !strings.Contains(first, want) {
			t.Errorf("first reply lacks %s:\n%s", want, first)
		}
	}
	if bytes.Contains([]byte(first), []byte(`"index":1`)) {
		t.Errorf("SameIndex reply used index 1:\n%s", first)
	}
	_, second := post(t, s, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if !strings.Contains(second, `"content":"two"`) {
		t.Errorf("second reply:\n%s", second)
	}
	if code, _ := post(t, s, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`); code != http.StatusBadRequest {
		t.Errorf("a request past the script answered %d", code)
	}
	if n := len(s.Requests()); n != 3 {
		t.Errorf("%d requests recorded", n)
	}
}
