package model

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Scripted is the deterministic model (docs/design.md §5). It reads the caller's
// text of the newest user message (framing blocks ignored):
//
//   - If the first line is not a directive, the answer is "echo: <text>".
//   - Otherwise each model request consumes the next unused lines. The
//     position is counted from the turn's own events (the assistant messages
//     after that user message), so it survives a takeover:
//     `sleep <duration>` waits, honouring cancellation, and goes on;
//     `say <text>` answers with that text and no tool call, ending the turn;
//     consecutive `call <tool> <json>` lines become one assistant message with
//     those tool calls in parallel, and the next request continues after
//     their results; `json <json>` calls structured_output with <json>;
//     `fail <text>` is a model error; `refuse` ends the turn blocked;
//     `max-tokens <text>` gives that partial text and ends max-tokens.
//     When the lines run out, the answer is empty and the turn ends.
//   - `on /<regexp>/ <directive>` lines take no request of their script's:
//     they answer a later user message that is no script (a notice that
//     joined the conversation). Such a message is answered by the
//     directives of the `on` lines, of the newest script before it, whose
//     regexp (Go syntax; it may not hold "/ ") matches its text, in order,
//     with $0, $1… (regexp.Expand) replaced by the match and its groups,
//     as if they were its script; when none matches, it is echoed. So a
//     scripted parent can answer a notice that names an id it could not
//     know beforehand: `on /request (r[0-9a-f]{24})/ call answer_request
//     {"requestId":"$1","decision":"approve"}`.
//
// Blank lines are skipped; any other line inside a script (or a sleep
// without a duration ≥ 0, a call without a tool name) is a model error
// naming the first such line, so a typo never passes silently.
type Scripted struct {
	// sleep waits d or until ctx is done (its error); nil: a timer. Tests
	// replace it to walk scripts without waiting.
	sleep func(ctx context.Context, d time.Duration) error
	// id is the model's id (Name); "" is "scripted".
	id string
}

// NewScripted returns the scripted model.
func NewScripted() *Scripted { return &Scripted{} }

// NewScriptedID returns the scripted model under another id: it answers
// exactly as NewScripted's, and names itself id (Name, and so the log's
// step/start records and a descriptor's models), so a worker can offer
// several models and a test can tell which one served a session.
func NewScriptedID(id string) *Scripted { return &Scripted{id: id} }

// ScriptedInfo names the scripted model in a provider descriptor's models
// (docs/protocol.md §9.1).
var ScriptedInfo = protocol.ModelInfo{Adapter: "scripted", ID: "scripted"}

func (*Scripted) Provider() string { return "scripted" }
func (s *Scripted) Name() string {
	if s.id == "" {
		return "scripted"
	}
	return s.id
}

// StructuredOutputTool is the child-only capture tool the `json` directive calls.
const StructuredOutputTool = protocol.ToolStructuredOutput

type directive struct {
	verb string        // sleep, say, call, json, fail, refuse, max-tokens
	arg  string        // text, duration, or json
	tool string        // for call
	dur  time.Duration // for sleep
	line int
}

// group is what one model request consumes: leading sleeps then one answer.
type group struct {
	sleeps []time.Duration
	answer []directive // one say/json/fail/refuse/max-tokens, or one or more calls; empty when lines ran out
}

var verbs = map[string]bool{"sleep": true, "say": true, "call": true, "json": true, "fail": true, "refuse": true, "max-tokens": true, "on": true}

// IsDirective reports whether line starts with a scripted-model directive
// (`on` only before a /: plain text may begin with the word).
func IsDirective(line string) bool {
	verb, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
	if verb == "on" {
		return strings.HasPrefix(strings.TrimSpace(rest), "/")
	}
	return verbs[verb]
}

func parseScript(text string) ([]group, error) {
	groups, _, err := parseScriptHandlers(text)
	return groups, err
}

// handler is an `on` line: a directive for a later message its re matches.
type handler struct {
	re   *regexp.Regexp
	line string // the directive, with $-references
}

// parseHandler parses the rest of an `on` line: /<regexp>/ <directive>.
func parseHandler(rest string, n int) (handler, error) {
	bad := fmt.Errorf("scripted: line %d: on needs /<regexp>/ and a directive", n)
	if !strings.HasPrefix(rest, "/") {
		return handler{}, bad
	}
	pat, line, ok := strings.Cut(rest[1:], "/ ")
	line = strings.TrimSpace(line)
	if !ok || pat == "" || !IsDirective(line) || strings.HasPrefix(line, "on ") {
		return handler{}, bad
	}
	re, err := regexp.Compile(pat)
	if err != nil {
		return handler{}, fmt.Errorf("scripted: line %d: %v", n, err)
	}
	return handler{re: re, line: line}, nil
}

// parseScriptHandlers parses a script into its groups and its `on` lines.
func parseScriptHandlers(text string) ([]group, []handler, error) {
	lines := strings.Split(text, "\n")
	var ds []directive
	var hs []handler
	for i, raw := range lines {
		line := strings.TrimSpace(raw)
		if line == "" {
			continue
		}
		verb, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		if !verbs[verb] {
			return nil, nil, fmt.Errorf("scripted: line %d %q is not a directive (sleep, say, call, json, fail, refuse, max-tokens, on)", i+1, line)
		}
		if verb == "on" {
			h, err := parseHandler(rest, i+1)
			if err != nil {
				return nil, nil, err
			}
			hs = append(hs, h)
			continue
		}
		d := directive{verb: verb, arg: rest, line: i + 1}
		if verb == "call" {
			name, args, _ := strings.Cut(rest, " ")
			if name == "" {
				return nil, nil, fmt.Errorf("scripted: line %d: call needs a tool name", i+1)
			}
			d.tool, d.arg = name, strings.TrimSpace(args)
			if d.arg == "" {
				d.arg = "{}"
			}
		}
		if verb == "sleep" {
			dur, err := time.ParseDuration(rest)
			if err != nil || dur < 0 {
				return nil, nil, fmt.Errorf("scripted: line %d: sleep needs a duration like 2s or 150ms", i+1)
			}
			d.dur = dur
		}
		ds = append(ds, d)
	}
	var groups []group
	var cur group
	for i := 0; i < len(ds); i++ {
		d := ds[i]
		switch d.verb {
		case "sleep":
			cur.sleeps = append(cur.sleeps, d.dur)
		case "call":
			cur.answer = append(cur.answer, d)
			for i+1 < len(ds) && ds[i+1].verb == "call" {
				i++
				cur.answer = append(cur.answer, ds[i])
			}
			groups, cur = append(groups, cur), group{}
		default:
			cur.answer = []directive{d}
			groups, cur = append(groups, cur), group{}
		}
	}
	if len(cur.sleeps) > 0 {
		groups = append(groups, cur)
	}
	return groups, hs, nil
}

// handled returns the script that answers text, a user message that is no
// script, from the `on` lines of the newest script among msgs (the
// messages before it): the directives whose regexp matches text, expanded;
// "" when none does.
func handled(msgs []Message, text string) (string, error) {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role != RoleUser {
			continue
		}
		prev := protocol.PlainText(msgs[i].Content)
		first, _, _ := strings.Cut(strings.TrimSpace(prev), "\n")
		if !IsDirective(first) {
			continue
		}
		_, hs, err := parseScriptHandlers(prev)
		if err != nil {
			return "", err
		}
		var out []string
		for _, h := range hs {
			if m := h.re.FindStringSubmatchIndex(text); m != nil {
				out = append(out, string(h.re.ExpandString(nil, h.line, text, m)))
			}
		}
		return strings.Join(out, "\n"), nil
	}
	return "", nil
}

// Stream answers one request from the script, with the scripted usage
// (ScriptedUsage) on every answer; a failed request (`fail`, a script
// error, a cancelled sleep) reports none, as a real endpoint's failure does.
func (s *Scripted) Stream(ctx context.Context, req Request, onText func(string)) (Response, error) {
	resp, err := s.answer(ctx, req, onText)
	if err == nil && req.MaxTokens > 0 {
		resp = cutAnswer(resp, req.MaxTokens)
	}
	if err == nil {
		u := ScriptedUsage(req, resp.Message)
		resp.Usage = &u
	}
	return resp, err
}

// EstimateInputTokens is the scripted model's input tokens for req, exact
// (ScriptedUsage's InputTokens): a budget reserves no more than it spends.
func (s *Scripted) EstimateInputTokens(req Request) int64 {
	return ScriptedUsage(req, protocol.AssistantMessage{}).InputTokens
}

// cutAnswer bounds an answer to maxTokens output tokens, one per word, as
// a real endpoint honours max_tokens: an answer with more words keeps its
// first maxTokens words of text, no tool calls, and finishes length.
func cutAnswer(resp Response, maxTokens int64) Response {
	if words(resp.Message.Content, resp.Message.ToolCalls) <= maxTokens {
		return resp
	}
	fields := strings.Fields(protocol.AllText(resp.Message.Content))
	fields = fields[:min(int64(len(fields)), maxTokens)]
	resp.Message = protocol.AssistantMessage{Content: protocol.Text(strings.Join(fields, " "))}
	if len(fields) == 0 {
		resp.Message.Content = []protocol.ContentBlock{}
	}
	resp.Finish = FinishLength
	return resp
}

// ScriptedUsage is the scripted model's deterministic usage for one request
// (docs/protocol.md §6.6), one token per word: InputTokens counts the words
// (strings.Fields) of every message of the request, framing included (the
// text of each content block, and each tool call's name and arguments);
// the system prompt and the tool list are not counted. OutputTokens counts
// the words of the answer the same way (its text, its tool calls' names and
// arguments). So a test knows a run's exact usage from its log.
func ScriptedUsage(req Request, answer protocol.AssistantMessage) protocol.Usage {
	var in int64
	for _, m := range req.Messages {
		in += words(m.Content, m.ToolCalls)
	}
	return protocol.Usage{InputTokens: in, OutputTokens: words(answer.Content, answer.ToolCalls)}
}

func words(content []protocol.ContentBlock, calls []protocol.ToolCall) int64 {
	n := len(strings.Fields(protocol.AllText(content)))
	for _, c := range calls {
		n += len(strings.Fields(c.Name)) + len(strings.Fields(c.Arguments))
	}
	return int64(n)
}

func (s *Scripted) answer(ctx context.Context, req Request, onText func(string)) (Response, error) {
	userIdx := -1
	for i := len(req.Messages) - 1; i >= 0; i-- {
		if req.Messages[i].Role == RoleUser {
			userIdx = i
			break
		}
	}
	if userIdx < 0 {
		return Response{}, &Error{Diagnostic: "scripted: no user message to answer"}
	}
	text := protocol.PlainText(req.Messages[userIdx].Content)
	first, _, _ := strings.Cut(strings.TrimSpace(text), "\n")
	if !IsDirective(first) {
		script, err := handled(req.Messages[:userIdx], text)
		if err != nil {
			return Response{}, &Error{Diagnostic: err.Error()}
		}
		if script == "" {
			answer := "echo: " + text
			onText(answer)
			return textResponse(answer, FinishStop), nil
		}
		text = script
	}
	groups, err := parseScript(text)
	if err != nil {
		return Response{}, &Error{Diagnostic: err.Error()}
	}
	pos := 0
	for _, m := range req.Messages[userIdx+1:] {
		if m.Role == RoleAssistant {
			pos++
		}
	}
	if pos >= len(groups) {
		return textResponse("", FinishStop), nil
	}
	g := groups[pos]
	sleep := s.sleep
	if sleep == nil {
		sleep = sleepCtx
	}
	for _, d := range g.sleeps {
		if err := sleep(ctx, d); err != nil {
			return Response{}, err
		}
	}
	if len(g.answer) == 0 {
		return textResponse("", FinishStop), nil
	}
	a := g.answer[0]
	switch a.verb {
	case "say":
		onText(a.arg)
		return textResponse(a.arg, FinishStop), nil
	case "max-tokens":
		onText(a.arg)
		return textResponse(a.arg, FinishLength), nil
	case "fail":
		return Response{}, &Error{Diagnostic: a.arg}
	case "refuse":
		return textResponse("", FinishRefusal), nil
	case "json":
		return Response{Message: protocol.AssistantMessage{
			Content:   []protocol.ContentBlock{},
			ToolCalls: []protocol.ToolCall{{ID: callID(len(req.Messages), 0), Name: StructuredOutputTool, Arguments: a.arg}},
		}, Finish: FinishToolCalls}, nil
	default: // call group
		calls := make([]protocol.ToolCall, len(g.answer))
		for i, c := range g.answer {
			calls[i] = protocol.ToolCall{ID: callID(len(req.Messages), i), Name: c.tool, Arguments: c.arg}
		}
		return Response{Message: protocol.AssistantMessage{Content: []protocol.ContentBlock{}, ToolCalls: calls}, Finish: FinishToolCalls}, nil
	}
}

// sleepCtx waits d, or until ctx is done (ctx's error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// callID is unique within a conversation: the request's position and the
// call's index in its message.
func callID(msgs, i int) string { return fmt.Sprintf("call_%d_%d", msgs, i) }

func textResponse(text string, f Finish) Response {
	return Response{Message: protocol.AssistantMessage{Content: protocol.Text(text)}, Finish: f}
}
