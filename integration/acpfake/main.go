// Command acpfake is a scripted ACP agent for the ACP bridge's fault tests,
// built on the ACP Go SDK's agent side. The first word of each prompt picks a
// behaviour:
//
//	echo TEXT     streams "echo: TEXT" in two chunks, end_turn
//	junk          writes non-JSON lines to stdout around its chunks, end_turn
//	long N        streams one chunk of N bytes ("x" repeated), end_turn
//	huge N        writes one JSON line of N bytes, a second later a chunk, end_turn
//	die           streams "partial", writes to stderr, exits with status 3
//	silent        streams "partial", then never writes again (ignores cancel)
//	stubborn      streams "partial", starts a grandchild that ignores SIGTERM,
//	              ignores SIGTERM and stdin EOF itself, never answers, and
//	              writes "PGID GRANDCHILD_PID" to ./stubborn.pids
//	env           answers with its environment, one KEY=VALUE per line
//	leak WORD...  writes 8 KiB of filler, its environment and "guessed WORD"
//	              for each word to stderr, exits with status 3
//	cwd           answers with its working directory
//	meta          answers with the _meta it got in session/new, as JSON
//	tools         reports a completed tool call and one left pending, end_turn
//	permission    asks one permission (reject_once "no", allow_once "yes"),
//	              answers with the outcome, end_turn
//	permission-allow-only  the same, offering allow_once "yes" only
//	permission-always      the same, offering reject_always "never" and
//	              allow_always "always" only
//	write PATH TEXT  reports a tool call w1 "Write PATH" (kind edit, raw
//	              input {path, content}) pending, asks permission for it
//	              (reject_once "no", allow_once "yes"); allowed, writes
//	              TEXT to PATH in its cwd and reports the call completed,
//	              else reports it failed; answers with the outcome, end_turn
//	trailing D    streams "main", answers end_turn, D later streams " trailing"
//	late D        streams "main", answers end_turn, D later streams " late",
//	              reports a tool call "late-tool" and asks a permission
//	endless N     writes N bytes on one stdout line that never ends, then
//	              stays silent (ignores cancel)
//	refuse | maxtokens | cancelled | maxturns   the matching stop reason
//	slow D        streams "partial", waits D honouring session/cancel
//
// Stray text also goes to stdout before initialize answers ("banner").
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	acp "github.com/coder/acp-go-sdk"
)

// out serializes whole lines on stdout between the SDK and raw writes.
type out struct{ mu sync.Mutex }

func (o *out) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return os.Stdout.Write(b)
}

func (o *out) raw(line string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = os.Stdout.WriteString(line + "\n")
}

type fake struct {
	conn *acp.AgentSideConnection
	out  *out

	mu       sync.Mutex
	meta     map[string]any
	stubborn bool
}

func (f *fake) Initialize(context.Context, acp.InitializeRequest) (acp.InitializeResponse, error) {
	f.out.raw("fake agent starting (this banner is not JSON)")
	return acp.InitializeResponse{ProtocolVersion: acp.ProtocolVersionNumber, AgentInfo: &acp.Implementation{Name: "acpfake", Version: "1"}}, nil
}

func (f *fake) Authenticate(context.Context, acp.AuthenticateRequest) (acp.AuthenticateResponse, error) {
	return acp.AuthenticateResponse{}, nil
}

func (f *fake) NewSession(_ context.Context, p acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	f.mu.Lock()
	f.meta = p.Meta
	f.mu.Unlock()
	return acp.NewSessionResponse{SessionId: "fake-session-1"}, nil
}

func (f *fake) Cancel(context.Context, acp.CancelNotification) error { return nil }

func (f *fake) chunk(ctx context.Context, sid acp.SessionId, text string) {
	_ = f.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: sid, Update: acp.UpdateAgentMessageText(text)})
}

func (f *fake) Prompt(ctx context.Context, p acp.PromptRequest) (acp.PromptResponse, error) {
	var text string
	for _, b := range p.Prompt {
		if b.Text != nil {
			text += b.Text.Text
		}
	}
	word, arg, _ := strings.Cut(strings.TrimSpace(text), " ")
	sid := p.SessionId
	end := acp.PromptResponse{StopReason: acp.StopReasonEndTurn}
	answer := func(s string) (acp.PromptResponse, error) {
		f.chunk(ctx, sid, s)
		return end, nil
	}
	switch word {
	case "echo":
		f.chunk(ctx, sid, "echo: ")
		return answer(arg)
	case "usage", "usage-quiet": // usage IN OUT: report the turn's tokens (quiet: no text)
		in, out, _ := strings.Cut(arg, " ")
		i, _ := strconv.Atoi(in)
		o, _ := strconv.Atoi(out)
		end.Usage = &acp.Usage{InputTokens: i, OutputTokens: o, TotalTokens: i + o}
		if word == "usage-quiet" {
			return end, nil
		}
		return answer("counted")
	case "junk":
		f.out.raw("plain text on stdout")
		f.chunk(ctx, sid, "after ")
		f.out.raw("{not json either")
		f.out.raw(`[1,2,3]`)
		return answer("junk")
	case "long":
		n, _ := strconv.Atoi(arg)
		return answer(strings.Repeat("x", n))
	case "huge":
		n, _ := strconv.Atoi(arg)
		f.out.raw(`{"jsonrpc":"2.0","method":"_fake/noise","params":{"pad":"` + strings.Repeat("y", n) + `"}}`)
		time.Sleep(time.Second)
		return answer("after huge")
	case "die":
		f.chunk(ctx, sid, "partial")
		time.Sleep(100 * time.Millisecond)
		fmt.Fprintln(os.Stderr, "fatal: the fake agent crashed on purpose")
		os.Exit(3)
	case "silent":
		f.chunk(ctx, sid, "partial")
		sleepForever()
	case "stubborn":
		signal.Ignore(syscall.SIGTERM)
		f.mu.Lock()
		f.stubborn = true
		f.mu.Unlock()
		gc := exec.Command("/bin/sh", "-c", `trap "" TERM; sleep 1000`)
		if err := gc.Start(); err != nil {
			return acp.PromptResponse{}, err
		}
		fmt.Fprintf(os.Stderr, "grandchild pid %d\n", gc.Process.Pid)
		f.chunk(ctx, sid, "partial")
		// Tell the test (through the workspace) which processes to look for.
		pids := fmt.Sprintf("%d %d\n", syscall.Getpgrp(), gc.Process.Pid)
		_ = os.WriteFile("stubborn.pids.tmp", []byte(pids), 0o600)
		_ = os.Rename("stubborn.pids.tmp", "stubborn.pids")
		sleepForever()
	case "leak":
		f.chunk(ctx, sid, "partial")
		time.Sleep(100 * time.Millisecond)
		fmt.Fprintln(os.Stderr, strings.Repeat("filler ", 8<<10/7))
		env := os.Environ()
		sort.Strings(env)
		fmt.Fprintln(os.Stderr, strings.Join(env, "\n"))
		for _, w := range strings.Fields(arg) {
			fmt.Fprintln(os.Stderr, "guessed "+w)
		}
		os.Exit(3)
	case "env":
		env := os.Environ()
		sort.Strings(env)
		return answer(strings.Join(env, "\n"))
	case "cwd":
		wd, _ := os.Getwd()
		return answer(wd)
	case "meta":
		f.mu.Lock()
		b, _ := json.Marshal(f.meta)
		f.mu.Unlock()
		return answer(string(b))
	case "promptmeta": // this prompt's own _meta
		b, _ := json.Marshal(p.Meta)
		return answer(string(b))
	case "tools":
		_ = f.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: sid, Update: acp.StartToolCall("t1", "Read notes",
			acp.WithStartKind(acp.ToolKindRead), acp.WithStartStatus(acp.ToolCallStatusPending), acp.WithStartRawInput(map[string]any{"path": "notes.txt"}))})
		_ = f.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: sid, Update: acp.UpdateToolCall("t1",
			acp.WithUpdateStatus(acp.ToolCallStatusCompleted), acp.WithUpdateContent([]acp.ToolCallContent{acp.ToolContent(acp.TextBlock("the notes"))}))})
		_ = f.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: sid, Update: acp.StartToolCall("t2", "Edit notes",
			acp.WithStartKind(acp.ToolKindEdit), acp.WithStartStatus(acp.ToolCallStatusInProgress))})
		return answer("read them")
	case "permission":
		r, err := f.conn.RequestPermission(ctx, acp.RequestPermissionRequest{SessionId: sid,
			ToolCall: acp.ToolCallUpdate{ToolCallId: "p1", Title: acp.Ptr("Write a file")},
			Options: []acp.PermissionOption{
				{Kind: acp.PermissionOptionKindRejectOnce, Name: "No", OptionId: "no"},
				{Kind: acp.PermissionOptionKindAllowOnce, Name: "Yes", OptionId: "yes"},
			}})
		if err != nil {
			return acp.PromptResponse{}, err
		}
		if r.Outcome.Selected != nil {
			return answer("selected " + string(r.Outcome.Selected.OptionId))
		}
		return answer("cancelled")
	case "permission-allow-only":
		r, err := f.conn.RequestPermission(ctx, acp.RequestPermissionRequest{SessionId: sid,
			ToolCall: acp.ToolCallUpdate{ToolCallId: "p1", Title: acp.Ptr("Write a file")},
			Options:  []acp.PermissionOption{{Kind: acp.PermissionOptionKindAllowOnce, Name: "Yes", OptionId: "yes"}}})
		if err != nil {
			return acp.PromptResponse{}, err
		}
		if r.Outcome.Selected != nil {
			return answer("selected " + string(r.Outcome.Selected.OptionId))
		}
		return answer("cancelled")
	case "permission-always":
		r, err := f.conn.RequestPermission(ctx, acp.RequestPermissionRequest{SessionId: sid,
			ToolCall: acp.ToolCallUpdate{ToolCallId: "p1", Title: acp.Ptr("Write a file")},
			Options: []acp.PermissionOption{
				{Kind: acp.PermissionOptionKindRejectAlways, Name: "Never", OptionId: "never"},
				{Kind: acp.PermissionOptionKindAllowAlways, Name: "Always", OptionId: "always"},
			}})
		if err != nil {
			return acp.PromptResponse{}, err
		}
		if r.Outcome.Selected != nil {
			return answer("selected " + string(r.Outcome.Selected.OptionId))
		}
		return answer("cancelled")
	case "write":
		path, content, _ := strings.Cut(arg, " ")
		title := "Write " + path
		input := map[string]any{"path": path, "content": content}
		_ = f.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: sid, Update: acp.StartToolCall("w1", title,
			acp.WithStartKind(acp.ToolKindEdit), acp.WithStartStatus(acp.ToolCallStatusPending), acp.WithStartRawInput(input))})
		r, err := f.conn.RequestPermission(ctx, acp.RequestPermissionRequest{SessionId: sid,
			ToolCall: acp.ToolCallUpdate{ToolCallId: "w1", Title: acp.Ptr(title), Kind: acp.Ptr(acp.ToolKindEdit), RawInput: input},
			Options: []acp.PermissionOption{
				{Kind: acp.PermissionOptionKindRejectOnce, Name: "No", OptionId: "no"},
				{Kind: acp.PermissionOptionKindAllowOnce, Name: "Yes", OptionId: "yes"},
			}})
		if err != nil {
			return acp.PromptResponse{}, err
		}
		outcome := "cancelled"
		if r.Outcome.Selected != nil {
			outcome = "selected " + string(r.Outcome.Selected.OptionId)
		}
		status, result := acp.ToolCallStatusFailed, "not allowed: "+outcome
		if outcome == "selected yes" {
			status, result = acp.ToolCallStatusCompleted, "wrote "+path
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				status, result = acp.ToolCallStatusFailed, err.Error()
			}
		}
		_ = f.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: sid, Update: acp.UpdateToolCall("w1",
			acp.WithUpdateStatus(status), acp.WithUpdateContent([]acp.ToolCallContent{acp.ToolContent(acp.TextBlock(result))}))})
		return answer(outcome)
	case "trailing", "late":
		d, _ := time.ParseDuration(arg)
		f.chunk(ctx, sid, "main")
		go func() {
			time.Sleep(d)
			bg := context.Background()
			f.chunk(bg, sid, " "+word)
			if word == "late" {
				_ = f.conn.SessionUpdate(bg, acp.SessionNotification{SessionId: sid, Update: acp.StartToolCall("late-tool", "Late work",
					acp.WithStartKind(acp.ToolKindRead), acp.WithStartStatus(acp.ToolCallStatusCompleted))})
				_, _ = f.conn.RequestPermission(bg, acp.RequestPermissionRequest{SessionId: sid,
					ToolCall: acp.ToolCallUpdate{ToolCallId: "late-p", Title: acp.Ptr("Late write")},
					Options: []acp.PermissionOption{
						{Kind: acp.PermissionOptionKindAllowOnce, Name: "Yes", OptionId: "yes"},
						{Kind: acp.PermissionOptionKindRejectOnce, Name: "No", OptionId: "no"},
					}})
			}
		}()
		return end, nil
	case "endless":
		n, _ := strconv.Atoi(arg)
		f.out.mu.Lock()
		_, _ = os.Stdout.WriteString(`{"jsonrpc":"2.0","method":"_fake/noise","params":{"pad":"` + strings.Repeat("y", n))
		f.out.mu.Unlock()
		sleepForever()
	case "refuse":
		f.chunk(ctx, sid, "I will not")
		return acp.PromptResponse{StopReason: acp.StopReasonRefusal}, nil
	case "maxtokens":
		f.chunk(ctx, sid, "partial")
		return acp.PromptResponse{StopReason: acp.StopReasonMaxTokens}, nil
	case "cancelled":
		return acp.PromptResponse{StopReason: acp.StopReasonCancelled}, nil
	case "maxturns":
		return acp.PromptResponse{StopReason: acp.StopReasonMaxTurnRequests}, nil
	case "slow":
		d, _ := time.ParseDuration(arg)
		f.chunk(ctx, sid, "partial")
		select {
		case <-ctx.Done():
			return acp.PromptResponse{StopReason: acp.StopReasonCancelled}, nil
		case <-time.After(d):
			return answer(" done")
		}
	}
	return answer("unknown behaviour " + word)
}

func (f *fake) CloseSession(context.Context, acp.CloseSessionRequest) (acp.CloseSessionResponse, error) {
	return acp.CloseSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionClose)
}

func (f *fake) ListSessions(context.Context, acp.ListSessionsRequest) (acp.ListSessionsResponse, error) {
	return acp.ListSessionsResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionList)
}

func (f *fake) ResumeSession(context.Context, acp.ResumeSessionRequest) (acp.ResumeSessionResponse, error) {
	return acp.ResumeSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionResume)
}

func (f *fake) SetSessionConfigOption(context.Context, acp.SetSessionConfigOptionRequest) (acp.SetSessionConfigOptionResponse, error) {
	return acp.SetSessionConfigOptionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionSetConfigOption)
}

func (f *fake) SetSessionMode(context.Context, acp.SetSessionModeRequest) (acp.SetSessionModeResponse, error) {
	return acp.SetSessionModeResponse{}, nil
}

func main() {
	o := &out{}
	f := &fake{out: o}
	f.conn = acp.NewAgentSideConnection(f, o, os.Stdin)
	<-f.conn.Done()
	f.mu.Lock()
	stubborn := f.stubborn
	f.mu.Unlock()
	if stubborn {
		sleepForever() // ignore EOF: only SIGKILL ends this process
	}
}

// sleepForever blocks without tripping the runtime's deadlock detector.
func sleepForever() {
	for {
		time.Sleep(time.Hour)
	}
}
