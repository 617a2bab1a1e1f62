package agent

import (
	"fmt"
	"maps"
	"slices"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/provider/contract"
)

// Index is what the runtime reads from a session's events, kept as events
// are added, so that each event's payload is decoded once per activation
// (issue 12, point 4): before it, a cold resume decoded the log's messages
// three times (History, NewCallIDs, the inbox and open-turn walks) and every
// step of a turn decoded the whole log again. It answers, for the events
// added so far, exactly what these functions answer for them:
//
//   - Messages: History (with history kept; see NewIndex);
//   - CallIDs: NewCallIDs (and the ids handed out since);
//   - InboxLog: sessionlog.InboxCursor and sessionlog.DoneMessages;
//   - LastTurn: sessionlog.LastTurn;
//   - OpenTurn, CloseOpenTurn: sessionlog.OpenTurn, sessionlog.CloseOpenTurn.
//
// Only the payloads these read are decoded: user and assistant messages,
// tool/call, tool/result and the inbox events as they are added, and the
// last turn/start and step/start when LastTurn or OpenTurn asks. Memory:
// with history kept, the decoded conversation (its texts, calls and
// results) beside the log's bytes, about the size of those payloads again;
// the inbox cursor and the call-id set as before. Not safe for concurrent
// use: its owner guards it (Agent and the ACP bridge's session: their mu).
type Index struct {
	// decodes counts payload decodes (Add's only work that grows with an
	// event's size); each added event is decoded at most once.
	decodes int

	calls *CallIDs
	inbox InboxLog

	// The last turn and the open turn, as sessionlog.LastTurn and OpenTurn
	// read them. Only the last turn/start and step/start matter to them,
	// so these are decoded when asked (resolveTurns, OpenTurn), the last first: a resume
	// decodes one of each, not every turn's.
	lastTurn, turn, step int64
	turnStarts           []protocol.SessionEvent // not decoded yet, in log order
	stepStart            protocol.SessionEvent   // the last step/start, when stepNew
	stepNew              bool                    // stepStart is not decoded yet
	open, stepOpen       bool
	turnCalls            []protocol.ToolCallData
	turnResults          map[string]bool

	conv *conversation // nil when history is not kept
}

// InboxLog is what a session's log says of its inbox items: the sequences
// seen (named by any inbox event) and done (dequeued or discarded), and the
// messageIds done (sessionlog.InboxCursor, sessionlog.DoneMessages). It is
// the provider SDK's (pkg/provider/contract).
type InboxLog = contract.InboxLog

func cloneInboxLog(l InboxLog) InboxLog {
	return InboxLog{Seen: maps.Clone(l.Seen), Done: maps.Clone(l.Done), DoneIDs: maps.Clone(l.DoneIDs)}
}

// NewIndex returns an empty index. With history it keeps the model
// conversation too (Messages; the in-process agent); without it (the ACP
// bridge, whose agent keeps its own) user messages are not decoded, and
// Messages returns nil.
func NewIndex(history bool) *Index {
	x := &Index{
		calls: &CallIDs{used: map[string]bool{}},
		inbox: InboxLog{Seen: map[protocol.Seq]bool{}, Done: map[protocol.Seq]bool{}, DoneIDs: map[string]bool{}},
	}
	if history {
		x.conv = &conversation{first: map[string]int{}, results: map[string]bool{}, answered: map[string]bool{}}
	}
	return x
}

// Add takes evs, the next events of the session in log order, decoding each
// payload the index reads once.
func (x *Index) Add(evs ...protocol.SessionEvent) {
	for _, ev := range evs {
		x.add(ev)
	}
}

func (x *Index) decode(ev protocol.SessionEvent, v any) error {
	x.decodes++
	return ev.Decode(v)
}

func (x *Index) add(ev protocol.SessionEvent) {
	switch ev.Type {
	case protocol.EvTurnStart:
		x.turnStarts = append(x.turnStarts, ev)
		x.open, x.stepOpen, x.turnCalls, x.turnResults = true, false, nil, map[string]bool{}
	case protocol.EvTurnEnd:
		x.open, x.stepOpen = false, false
	case protocol.EvStepStart:
		x.stepStart, x.stepNew, x.stepOpen = ev, true, true
	case protocol.EvStepEnd:
		x.stepOpen = false
	case protocol.EvToolCall:
		var d protocol.ToolCallData
		if x.decode(ev, &d) == nil {
			x.calls.used[d.CallID] = true
			x.turnCalls = append(x.turnCalls, d)
		}
	case protocol.EvToolResult:
		var d protocol.ToolResultData
		err := x.decode(ev, &d)
		if err == nil {
			if x.turnResults == nil { // results before any turn/start
				x.turnResults = map[string]bool{}
			}
			x.turnResults[d.CallID] = true
		}
		if x.conv != nil {
			x.conv.result(ev, d, err)
		}
	case protocol.EvAssistantMessage:
		var d protocol.AssistantMessageData
		err := x.decode(ev, &d)
		if err == nil {
			for _, tc := range d.Message.ToolCalls {
				x.calls.used[tc.ID] = true
			}
		}
		if x.conv != nil {
			x.conv.assistant(ev, d, err)
		}
	case protocol.EvUserMessage:
		if x.conv == nil {
			return
		}
		var d protocol.UserMessageData
		err := x.decode(ev, &d)
		x.conv.user(ev, d, err)
	case protocol.EvInboxEnqueue:
		var d protocol.InboxEnqueueData
		if x.decode(ev, &d) == nil {
			x.inbox.Seen[d.InboxSeq] = true
		}
	case protocol.EvInboxDequeue:
		var d protocol.InboxDequeueData
		if x.decode(ev, &d) == nil {
			x.claimed(d.InboxSeq, d.MessageID)
		}
	case protocol.EvInboxDiscard:
		var d protocol.InboxDiscardData
		if x.decode(ev, &d) == nil {
			x.claimed(d.InboxSeq, d.MessageID)
		}
	}
}

func (x *Index) claimed(seq protocol.Seq, id string) {
	x.inbox.Seen[seq], x.inbox.Done[seq] = true, true
	if id != "" {
		x.inbox.DoneIDs[id] = true
	}
}

// Messages returns the model conversation of the events added so far, as
// History would rebuild it from them (the same messages, or the same
// error); nil without history kept. The slice is the caller's: later adds
// do not change it.
func (x *Index) Messages() ([]model.Message, error) {
	if x.conv == nil {
		return nil, nil
	}
	return x.conv.messages()
}

// CallIDs returns the session's call-id set: the ids of the added events'
// tool calls, and those Unique handed out.
func (x *Index) CallIDs() *CallIDs { return x.calls }

// InboxLog returns a copy of what the added events say of the inbox.
func (x *Index) InboxLog() InboxLog { return cloneInboxLog(x.inbox) }

// LastTurn returns the number of the last turn started (0 if none).
func (x *Index) LastTurn() int64 {
	x.resolveTurns()
	return x.lastTurn
}

// resolveTurns decodes the turn/start events added since it last ran: the
// last gives the turn OpenTurn reports (what it holds even when it does not
// decode, as sessionlog.OpenTurn reads it), and the last that decodes gives
// LastTurn, so earlier ones are decoded only while the later do not.
func (x *Index) resolveTurns() {
	n := len(x.turnStarts)
	if n == 0 {
		return
	}
	var d protocol.TurnData
	err := x.decode(x.turnStarts[n-1], &d)
	x.turn = d.Turn
	if err == nil {
		x.lastTurn = d.Turn
	}
	for i := n - 2; err != nil && i >= 0; i-- {
		var e protocol.TurnData
		if err = x.decode(x.turnStarts[i], &e); err == nil {
			x.lastTurn = e.Turn
		}
	}
	x.turnStarts = nil
}

// OpenTurn reports the turn left open by the added events and its tool calls
// without a result (sessionlog.OpenTurn).
func (x *Index) OpenTurn() (turn int64, open bool, step int64, stepOpen bool, pending []protocol.ToolCallData) {
	x.resolveTurns()
	if x.stepNew {
		var d protocol.StepData
		_ = x.decode(x.stepStart, &d)
		x.step, x.stepNew = d.Step, false
	}
	if x.open {
		for _, c := range x.turnCalls {
			if !x.turnResults[c.CallID] {
				pending = append(pending, c)
			}
		}
	}
	return x.turn, x.open, x.step, x.stepOpen, pending
}

// CloseOpenTurn returns the events that close the turn the added events
// left open, nil when none is (sessionlog.CloseOpenTurn).
func (x *Index) CloseOpenTurn(reason protocol.TurnEndReason, nowMs int64) ([]protocol.SessionEvent, error) {
	turn, open, step, stepOpen, pending := x.OpenTurn()
	if !open {
		return nil, nil
	}
	return sessionlog.CloseTurn(turn, step, stepOpen, pending, reason, nowMs)
}

// conversation is History kept incrementally. History's rules, for a log
// read in order: a call is kept in the first assistant message that names
// its id, once, when the log holds a result for it anywhere; a result is
// kept when such a message precedes it and no earlier result for its call
// was kept. Only the first rule looks ahead: a result makes its call's
// message keep the call, so that message's calls are chosen again.
type conversation struct {
	msgs []model.Message
	// calls holds, for each assistant message of msgs (by index), its
	// logged calls with their arguments as ReplayArguments gives them.
	calls map[int][]protocol.ToolCall
	// first maps a call id to the index in msgs of the first assistant
	// message naming it.
	first             map[string]int
	results, answered map[string]bool
	// History reports the first undecodable tool result before any other
	// undecodable message (it reads the results first).
	resultErr, otherErr error
}

func (c *conversation) messages() ([]model.Message, error) {
	switch {
	case c.resultErr != nil:
		return nil, c.resultErr
	case c.otherErr != nil:
		return nil, c.otherErr
	}
	return slices.Clone(c.msgs), nil
}

func (c *conversation) user(ev protocol.SessionEvent, d protocol.UserMessageData, err error) {
	if err != nil {
		if c.otherErr == nil {
			c.otherErr = fmt.Errorf("event %d: %w", ev.Seq, err)
		}
		return
	}
	c.msgs = append(c.msgs, model.Message{Role: model.RoleUser, Content: d.Content})
}

func (c *conversation) assistant(ev protocol.SessionEvent, d protocol.AssistantMessageData, err error) {
	if err != nil {
		if c.otherErr == nil {
			c.otherErr = fmt.Errorf("event %d: %w", ev.Seq, err)
		}
		return
	}
	i := len(c.msgs)
	c.msgs = append(c.msgs, model.Message{
		Role: model.RoleAssistant, Content: d.Message.Content, ReasoningContent: d.Message.ReasoningContent,
	})
	if len(d.Message.ToolCalls) == 0 {
		return
	}
	calls := make([]protocol.ToolCall, len(d.Message.ToolCalls))
	for k, tc := range d.Message.ToolCalls {
		if _, ok := c.first[tc.ID]; !ok {
			c.first[tc.ID] = i
		}
		tc.Arguments = ReplayArguments(tc.Arguments)
		calls[k] = tc
	}
	if c.calls == nil {
		c.calls = map[int][]protocol.ToolCall{}
	}
	c.calls[i] = calls
	c.choose(i)
}

// choose sets the calls assistant message i keeps.
func (c *conversation) choose(i int) {
	var kept []protocol.ToolCall
	logged := c.calls[i]
	for k, tc := range logged {
		if !c.results[tc.ID] || c.first[tc.ID] != i ||
			slices.ContainsFunc(logged[:k], func(p protocol.ToolCall) bool { return p.ID == tc.ID }) {
			continue
		}
		kept = append(kept, tc)
	}
	c.msgs[i].ToolCalls = kept
}

func (c *conversation) result(ev protocol.SessionEvent, d protocol.ToolResultData, err error) {
	if err != nil {
		if c.resultErr == nil {
			c.resultErr = fmt.Errorf("event %d: %w", ev.Seq, err)
		}
		return
	}
	i, called := c.first[d.CallID]
	if !c.results[d.CallID] {
		c.results[d.CallID] = true
		if called {
			c.choose(i)
		}
	}
	if !called || c.answered[d.CallID] {
		return
	}
	c.answered[d.CallID] = true
	c.msgs = append(c.msgs, model.Message{
		Role: model.RoleTool, Content: d.Content, ToolCallID: d.CallID, Name: d.Name, IsError: d.IsError,
	})
}
