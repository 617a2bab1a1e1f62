package integration

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// tsEditorScript is an editor on the ACP TypeScript SDK's client side that
// runs `brood acp-agent` and answers its permission requests.
const tsEditorScript = acpNodeDir + "/ts-editor.mjs"

// tsEditorLine is one line the TypeScript editor writes.
type tsEditorLine struct {
	Session string `json:"session"`
	Stop    string `json:"stop"`
	Ask     *struct {
		SessionID string `json:"sessionId"`
		ToolCall  struct {
			ToolCallID string         `json:"toolCallId"`
			Title      string         `json:"title"`
			Kind       string         `json:"kind"`
			RawInput   map[string]any `json:"rawInput"`
		} `json:"toolCall"`
		Options []struct {
			OptionID string `json:"optionId"`
			Kind     string `json:"kind"`
		} `json:"options"`
		Meta map[string]map[string]any `json:"_meta"`
	} `json:"ask"`
	Update *struct {
		ToolCallID string `json:"toolCallId"`
		Status     string `json:"status"`
	} `json:"update"`
}

// TestACPAgentAsksTheTypeScriptEditor (issue 33, item 4): `brood acp-agent`
// under an editor written with the official ACP TypeScript SDK: a background
// child's write_file request arrives as session/request_permission in the
// editor's session (the SDK checks it against the ACP schema), and the
// editor's choice reaches the child: approved, the file is written and the
// child's turn completes; denied, the call's result is the denial.
func TestACPAgentAsksTheTypeScriptEditor(t *testing.T) {
	acpDep(t, tsSDK)
	script := acpDep(t, tsEditorScript)
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	const write = `call write_file {"path":"x.txt","content":"hi"}` + "\nsay done"
	child, err := json.Marshal(write)
	if err != nil {
		t.Fatal(err)
	}
	prompt := `call subagent {"description":"writer","prompt":` + string(child) + `,"run_in_background":true}` + "\nsay started"
	tests := []struct {
		option  string
		state   string
		result  string
		isError bool
	}{
		{"approve", protocol.RequestApproved, "wrote 2 bytes", false},
		{"deny", protocol.RequestDenied, "denied in the editor", true},
	}
	for _, tt := range tests {
		t.Run(tt.option, func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command("node", script, broodBin, s.Server.ClientURL(), dir, tt.option, prompt)
			cmd.Dir = filepath.Dir(script)
			var stderr strings.Builder
			var mu sync.Mutex
			cmd.Stderr = writerFunc(func(b []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return stderr.Write(b) })
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				<-done
				if t.Failed() {
					mu.Lock()
					t.Logf("stderr of the editor and acp-agent:\n%s", stderr.String())
					mu.Unlock()
				}
			})
			var lmu sync.Mutex
			var lines []tsEditorLine
			go func() {
				sc := bufio.NewScanner(stdout)
				sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
				for sc.Scan() {
					var l tsEditorLine
					if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
						t.Errorf("editor line %q: %v", sc.Text(), err)
						continue
					}
					lmu.Lock()
					lines = append(lines, l)
					lmu.Unlock()
				}
			}()
			seen := func() []tsEditorLine {
				lmu.Lock()
				defer lmu.Unlock()
				return append([]tsEditorLine(nil), lines...)
			}
			var session, stop string
			var asks []tsEditorLine
			testutil.Eventually(t, 90*time.Second, func() bool {
				session, stop, asks = "", "", nil
				for _, l := range seen() {
					switch {
					case l.Session != "":
						session = l.Session
					case l.Stop != "":
						stop = l.Stop
					case l.Ask != nil:
						asks = append(asks, l)
					}
				}
				return stop != "" && len(asks) > 0
			}, "the prompt ends and the editor is asked")
			if stop != "end_turn" {
				t.Fatalf("the prompt stopped %q", stop)
			}
			ask := asks[0].Ask
			brood := ask.Meta[protocol.ACPMetaKey]
			id, _ := brood["requestId"].(string)
			asking, _ := brood["sessionId"].(string)
			switch {
			case ask.SessionID != session:
				t.Fatalf("asked in session %q, want the editor's %q", ask.SessionID, session)
			case id == "" || ask.ToolCall.ToolCallID != "request-"+id:
				t.Fatalf("the ask's tool call %q and _meta %v", ask.ToolCall.ToolCallID, ask.Meta)
			case ask.ToolCall.Kind != "edit" || !strings.Contains(ask.ToolCall.Title, "write_file") || !strings.Contains(ask.ToolCall.Title, asking):
				t.Fatalf("the ask's tool call %+v", ask.ToolCall)
			case ask.ToolCall.RawInput["path"] != "x.txt" || ask.ToolCall.RawInput["content"] != "hi":
				t.Fatalf("rawInput %v", ask.ToolCall.RawInput)
			case len(ask.Options) != 2 || ask.Options[0].OptionID != "approve" || ask.Options[0].Kind != "allow_once" ||
				ask.Options[1].OptionID != "deny" || ask.Options[1].Kind != "reject_once":
				t.Fatalf("options %+v", ask.Options)
			}

			// The answer reaches the child: its call ends and its turn with it.
			var evs []protocol.SessionEvent
			testutil.Eventually(t, 60*time.Second, func() bool {
				_, evs = s.Log(asking)
				return len(evs) > 0 && evs[len(evs)-1].Type == protocol.EvTurnEnd
			}, "the child's turn ends")
			var trail []string
			var answer protocol.RequestAnswerData
			var result protocol.ToolResultData
			for _, ev := range evs {
				switch ev.Type {
				case protocol.EvRequestOpen:
					trail = append(trail, ev.Type)
				case protocol.EvRequestAnswer:
					trail = append(trail, ev.Type)
					if err := ev.Decode(&answer); err != nil {
						t.Fatal(err)
					}
				case protocol.EvToolResult:
					trail = append(trail, ev.Type)
					if err := ev.Decode(&result); err != nil {
						t.Fatal(err)
					}
				}
			}
			if want := "request/open request/answer tool/result"; strings.Join(trail, " ") != want {
				t.Fatalf("the child's log: %v, want %s", trail, want)
			}
			if answer.RequestID != id || answer.State != tt.state || answer.By.Kind != protocol.AnswererUser {
				t.Fatalf("the answer %+v, want %s by the user", answer, tt.state)
			}
			if result.IsError != tt.isError || !strings.Contains(protocol.PlainText(result.Content), tt.result) {
				t.Fatalf("the write_file result %+v, want (error %v) %q", result, tt.isError, tt.result)
			}
			b, err := os.ReadFile(filepath.Join(dir, "x.txt"))
			if written := err == nil && string(b) == "hi"; written == tt.isError {
				t.Fatalf("x.txt: %q, %v", b, err)
			}
			// The editor saw the request's tool call go pending, then completed.
			testutil.Eventually(t, 10*time.Second, func() bool {
				var st []string
				for _, l := range seen() {
					if l.Update != nil && l.Update.ToolCallID == "request-"+id {
						st = append(st, l.Update.Status)
					}
				}
				return strings.Join(st, " ") == "pending completed"
			}, "the editor sees the request's tool call pending, then completed")
			if n := len(asks); n != 1 {
				t.Fatalf("asked %d times", n)
			}
			_ = stdin.Close()
			select {
			case err := <-done:
				done <- err
				if err != nil {
					t.Fatalf("the editor exited: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the editor did not exit after its stdin closed")
			}
		})
	}
}

// writerFunc is an io.Writer of a function.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
