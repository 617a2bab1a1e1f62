package coordinator_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
	spawnworker "github.com/brood-dev/brood/services/spawn-worker"
)

// background is a subagent call that starts prompt in the background.
func background(t *testing.T, prompt string) string {
	t.Helper()
	p, err := json.Marshal(prompt)
	if err != nil {
		t.Fatal(err)
	}
	return `call subagent {"description":"helper","prompt":` + string(p) + `,"run_in_background":true}`
}

// toolResults returns the results of tool name in a log.
func toolResults(evs []protocol.SessionEvent, name string) []protocol.ToolResultData {
	var out []protocol.ToolResultData
	for _, ev := range evs {
		var d protocol.ToolResultData
		if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.Name == name {
			out = append(out, d)
		}
	}
	return out
}

// requestNotices returns the subagent-request notices a log claimed.
func requestNotices(evs []protocol.SessionEvent) []protocol.UserMessageData {
	var out []protocol.UserMessageData
	for _, ev := range evs {
		var d protocol.UserMessageData
		if ev.Type == protocol.EvUserMessage && ev.Decode(&d) == nil && d.Source.Kind == protocol.SourceSubagentRequest {
			out = append(out, d)
		}
	}
	return out
}

// TestParentAgentAnswersWithAnswerRequest (issue 33, item 4): a child's
// request is told to the nearest ancestor that takes requests, as a
// subagent-request notice in its inbox; its scripted model answers with
// answer_request (an `on` line of its script) and the child's call runs
// once, gets the denial or the answer, and its turn completes; a second
// answer is an ALREADY_ANSWERED error result. A parent that does not take
// requests (its descriptor lacks answer_request) is passed over for its
// own parent; one whose tool filter denies it, or which waits on the asking
// child's one-shot run in the foreground, is told nothing, and the request
// waits for the user.
func TestParentAgentAnswersWithAnswerRequest(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	// The agent's children run on spawn2, whose agents do not take
	// requests: its descriptor does not list answer_request.
	s.AddSpawnWorker(func(c *worker.InProcessConfig) { c.SubagentProvider = "spawn2" })
	desc := spawnworker.Descriptor("spawn2")
	desc.Tools = slices.DeleteFunc(slices.Clone(desc.Tools), func(n string) bool { return n == protocol.ToolAnswerRequest })
	s.AddInProcessWorker(desc)
	const write = `call write_file {"path":"x.txt","content":"hi"}` + "\nsay done"
	const ask = `call ask {"question":"Which database?","choices":["postgres","sqlite"]}` + "\nsay done"
	on := func(args string) string {
		return `on /request (r[0-9a-f]{24})/ call answer_request {"requestId":"$1",` + args + "}"
	}
	approve := on(`"decision":"approve"`)
	tests := []struct {
		name    string
		script  func(t *testing.T) string // the agent's
		filter  *protocol.ToolFilter      // the agent's
		tool    string                    // the asking call's
		result  string                    // its result contains
		isError bool
		written bool
		told    bool // the agent got the notice
		answers int  // answer_request calls that succeeded, failed
		refused int
	}{
		{"approve a write_file", func(t *testing.T) string { return approve + "\n" + background(t, write) + "\nsay started" },
			nil, "write_file", "wrote 2 bytes", false, true, true, 1, 0},
		{"deny a write_file", func(t *testing.T) string {
			return on(`"decision":"deny","reason":"not in this repo"`) + "\n" + background(t, write) + "\nsay started"
		}, nil, "write_file", "(an ancestor): not in this repo", true, false, true, 1, 0},
		{"answer a question", func(t *testing.T) string {
			return on(`"decision":"answer","text":"sqlite"`) + "\n" + background(t, ask) + "\nsay started"
		}, nil, "ask", "sqlite", false, false, true, 1, 0},
		{"a second answer is ALREADY_ANSWERED", func(t *testing.T) string {
			// One after the other (the sleep ends the first call's group).
			return approve + "\non /request / sleep 0s\n" + approve + "\n" + background(t, write) + "\nsay started"
		}, nil, "write_file", "wrote 2 bytes", false, true, true, 1, 1},
		{"a grandchild's request passes over a parent that does not take requests", func(t *testing.T) string {
			return approve + "\n" + background(t, background(t, write)+"\nsay started") + "\nsay started"
		}, nil, "write_file", "wrote 2 bytes", false, true, true, 1, 0},
		{"an agent waiting on its one-shot child in the foreground is not told", func(t *testing.T) string {
			return approve + "\n" + `call subagent {"description":"helper","prompt":"call write_file {\"path\":\"x.txt\",\"content\":\"hi\"}\nsay done"}` + "\nsay started"
		}, nil, "write_file", "wrote 2 bytes", false, true, false, 0, 0},
		{"an agent whose filter denies answer_request is not told", func(t *testing.T) string { return approve + "\n" + background(t, write) + "\nsay started" },
			&protocol.ToolFilter{Deny: []string{protocol.ToolAnswerRequest}}, "write_file", "wrote 2 bytes", false, true, false, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			dir := t.TempDir()
			root := s.Root(dir)
			a, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "agent",
				Prompt: protocol.Text(tt.script(t)), Options: protocol.ContinuableOptions{ToolFilter: tt.filter}})
			if err != nil {
				t.Fatal(err)
			}
			// The request, once opened, and (when no agent takes it) the
			// user's answer.
			var req protocol.RequestRecord
			testutil.Eventually(t, 60*time.Second, func() bool {
				l, err := s.Client.Requests(ctx, protocol.RequestsListRequest{Authority: s.Grant(), Under: a.ChildID, All: true})
				if err != nil || len(l.Requests) != 1 {
					return false
				}
				req = l.Requests[0]
				return true
			}, "the request is opened")
			if !tt.told {
				if _, evs := s.Log(a.ChildID); len(requestNotices(evs)) != 0 {
					t.Fatalf("the agent was told: %+v", requestNotices(evs))
				}
				p, err := s.Client.Inbox(ctx, protocol.InboxReadRequest{SessionID: a.ChildID, Authority: s.Grant()})
				if err != nil || len(p.Items) != 0 {
					t.Fatalf("the agent's inbox: %+v, %v; want nothing", p, err)
				}
				if _, err := s.Client.AnswerRequest(ctx, protocol.RequestAnswerRequest{RequestID: req.ID, Authority: s.Grant(), Answer: protocol.AnswerApprove}); err != nil {
					t.Fatal(err)
				}
			}
			// The asking child's call ends and its turn completes.
			var evs []protocol.SessionEvent
			testutil.Eventually(t, 60*time.Second, func() bool {
				_, evs = s.Log(req.SessionID)
				return len(toolResults(evs, tt.tool)) > 0 && evs[len(evs)-1].Type == protocol.EvTurnEnd
			}, "the asking call ends and its turn with it")
			var trail []string
			var end protocol.TurnEndData
			var answer protocol.RequestAnswerData
			for _, ev := range evs {
				switch ev.Type {
				case protocol.EvRequestOpen, protocol.EvRequestAnswer, protocol.EvToolResult:
					trail = append(trail, ev.Type)
				case protocol.EvTurnEnd:
					if err := ev.Decode(&end); err != nil {
						t.Fatal(err)
					}
				}
				if ev.Type == protocol.EvRequestAnswer {
					if err := ev.Decode(&answer); err != nil {
						t.Fatal(err)
					}
				}
			}
			if want := "request/open request/answer tool/result"; strings.Join(trail, " ") != want {
				t.Fatalf("the child's log: %v, want %s", trail, want)
			}
			if end.Reason.Kind != protocol.TurnCompleted {
				t.Fatalf("the child's turn ended %+v", end.Reason)
			}
			results := toolResults(evs, tt.tool)
			if len(results) != 1 || results[0].IsError != tt.isError || !strings.Contains(protocol.PlainText(results[0].Content), tt.result) {
				t.Fatalf("%s results %+v, want one (error %v) with %q", tt.tool, results, tt.isError, tt.result)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "x.txt")); (err == nil) != tt.written || (tt.written && string(b) != "hi") {
				t.Fatalf("x.txt: %q, %v; written: want %v", b, err, tt.written)
			}
			wantBy := protocol.Answerer{Kind: protocol.AnswererAgent, SessionID: a.ChildID}
			if !tt.told {
				wantBy = protocol.Answerer{Kind: protocol.AnswererUser}
			}
			if answer.By.Kind != wantBy.Kind || answer.By.SessionID != wantBy.SessionID {
				t.Fatalf("answered by %+v, want %+v", answer.By, wantBy)
			}
			if !tt.told { // and never was, now that the open is long over
				if _, evs := s.Log(a.ChildID); len(requestNotices(evs)) != 0 || len(toolResults(evs, protocol.ToolAnswerRequest)) != 0 {
					t.Fatalf("the agent was told: %+v", requestNotices(evs))
				}
				return
			}
			// The agent's side: the notice, then its answers.
			var notices []protocol.UserMessageData
			var answers []protocol.ToolResultData
			testutil.Eventually(t, 30*time.Second, func() bool {
				_, pevs := s.Log(a.ChildID)
				notices, answers = requestNotices(pevs), toolResults(pevs, protocol.ToolAnswerRequest)
				return len(answers) == tt.answers+tt.refused
			}, "the agent's answers are logged")
			text := protocol.PlainText(notices[0].Content)
			if len(notices) != 1 || notices[0].Source.SenderSessionID != req.SessionID || !strings.Contains(text, req.ID) || !strings.Contains(text, tt.tool) && tt.tool != "ask" ||
				tt.tool == "ask" && !strings.Contains(text, `["postgres","sqlite"]`) {
				t.Fatalf("the notices: %+v", notices)
			}
			ok, refused := 0, 0
			for _, r := range answers {
				switch {
				case !r.IsError:
					ok++
				case strings.Contains(protocol.PlainText(r.Content), string(protocol.CodeAlreadyAnswered)):
					refused++
				default:
					t.Fatalf("answer_request result %q", protocol.PlainText(r.Content))
				}
			}
			if ok != tt.answers || refused != tt.refused {
				t.Fatalf("answer_request: %d taken, %d ALREADY_ANSWERED; want %d, %d", ok, refused, tt.answers, tt.refused)
			}
		})
	}
}
