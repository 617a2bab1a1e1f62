package a2agateway

import (
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/brood-dev/brood/pkg/protocol"
)

// A task id is `<contextId>.<messageId>`: the continuable child that is the
// A2A context, and the inbox message id of the message that opened the task
// (docs/a2a.md, "Mapping"). Both are ^[A-Za-z0-9_-]{1,64}$, so the dot is
// never part of either and the id parses back without any lookup.
const taskIDSep = "."

func taskIDOf(childID, messageID string) a2a.TaskID {
	return a2a.TaskID(childID + taskIDSep + messageID)
}

// parseTaskID splits a task id; ok is false for anything the gateway never
// made (the caller gets TaskNotFound, as for another user's task).
func parseTaskID(id a2a.TaskID) (childID, messageID string, ok bool) {
	childID, messageID, ok = strings.Cut(string(id), taskIDSep)
	if !ok || !protocol.ValidID(childID) || !protocol.ValidID(messageID) {
		return "", "", false
	}
	return childID, messageID, true
}

// Extension URIs the gateway declares in every Agent Card (docs/a2a.md,
// "Extensions").
const (
	// ExtCascadingCancel: cancelling a task ends the context's activation and
	// that of every descendant it started, child first.
	ExtCascadingCancel = "urn:brood:a2a:ext:cascading-cancel:v1"
	// ExtUsage: a task's metadata carries the model usage of its turn under
	// this key ({inputTokens, outputTokens}); budgets are a seam.
	ExtUsage = "urn:brood:a2a:ext:usage:v1"
)

// Metadata keys of a task.
const (
	metaTurn       = "brood/turn"
	metaStopReason = "brood/turnEnd"
	metaCause      = "brood/cause"
)

// taskFold folds one context's session log into the A2A task of one
// message: the message's user/message gives its turn, that turn's assistant
// messages its output and usage, its turn/end its terminal state
// (docs/a2a.md, "Task states"). Everything comes from the log, so a fold
// rebuilt after a gateway restart is the same fold.
type taskFold struct {
	childID, messageID string
	turn               int64
	state              a2a.TaskState
	prompt             []protocol.ContentBlock
	output             []protocol.ContentBlock
	usage              protocol.Usage
	usageSeen          bool
	reason             protocol.TurnEndReason
	updated            time.Time
	nextSeq            int64
	cursor             protocol.Seq
}

func newTaskFold(childID, messageID string) *taskFold {
	return &taskFold{childID: childID, messageID: messageID, state: a2a.TaskStateSubmitted}
}

func (f *taskFold) id() a2a.TaskID { return taskIDOf(f.childID, f.messageID) }

// TaskInfo makes the fold an a2a.TaskInfoProvider.
func (f *taskFold) TaskInfo() a2a.TaskInfo {
	return a2a.TaskInfo{TaskID: f.id(), ContextID: f.childID}
}

func (f *taskFold) terminal() bool { return f.state.Terminal() }

// apply folds one event and returns the A2A events it makes for a stream:
// `working` when the message's turn starts, a status update with the text of
// each assistant message of the turn, and at the turn's end the output as an
// artifact and the terminal status.
func (f *taskFold) apply(ev protocol.SessionEvent) []a2a.Event {
	if ev.Seq >= f.nextSeq {
		f.nextSeq = ev.Seq + 1
	}
	if f.terminal() {
		return nil
	}
	at := time.UnixMilli(ev.Time).UTC()
	switch ev.Type {
	case protocol.EvUserMessage:
		var d protocol.UserMessageData
		if ev.Decode(&d) != nil || d.ID != f.messageID || f.turn != 0 {
			return nil
		}
		f.turn, f.prompt, f.state, f.updated = d.Turn, d.Content, a2a.TaskStateWorking, at
		return []a2a.Event{f.status(nil)}
	case protocol.EvAssistantMessage:
		var d protocol.AssistantMessageData
		if f.turn == 0 || ev.Decode(&d) != nil || d.Turn != f.turn {
			return nil
		}
		if d.Usage != nil {
			f.usage.InputTokens += d.Usage.InputTokens
			f.usage.OutputTokens += d.Usage.OutputTokens
			f.usageSeen = true
		}
		text := textOf(d.Message.Content)
		if text == "" {
			return nil
		}
		f.output, f.updated = d.Message.Content, at
		return []a2a.Event{f.status(a2a.NewMessageForTask(a2a.MessageRoleAgent, f, a2a.NewTextPart(text)))}
	case protocol.EvInboxDiscard:
		var d protocol.InboxDiscardData
		if f.turn != 0 || ev.Decode(&d) != nil || d.MessageID != f.messageID {
			return nil
		}
		f.state, f.updated = a2a.TaskStateCanceled, at
		f.reason = protocol.TurnEndReason{Kind: protocol.TurnAborted, Error: d.Reason}
		return []a2a.Event{f.status(a2a.NewMessageForTask(a2a.MessageRoleAgent, f, a2a.NewTextPart("discarded unrun: "+d.Reason)))}
	case protocol.EvTurnEnd:
		var d protocol.TurnEndData
		if f.turn == 0 || ev.Decode(&d) != nil || d.Turn != f.turn {
			return nil
		}
		f.reason, f.state, f.updated = d.Reason, stateOf(d.Reason), at
		var out []a2a.Event
		if a := f.artifact(); a != nil {
			out = append(out, &a2a.TaskArtifactUpdateEvent{TaskID: f.id(), ContextID: f.childID, Artifact: a, LastChunk: true})
		}
		var msg *a2a.Message
		if d.Reason.Kind != protocol.TurnCompleted {
			msg = a2a.NewMessageForTask(a2a.MessageRoleAgent, f, a2a.NewTextPart(reasonText(d.Reason)))
		}
		return append(out, f.status(msg))
	}
	return nil
}

// stateOf maps a turn's end to a terminal A2A state: completed; aborted
// (an interrupt, a dispose, a drain, a parent's end) is canceled; a refusal
// (blocked) is rejected; an error, the token limit and a turn closed after its
// host died are failed.
func stateOf(r protocol.TurnEndReason) a2a.TaskState {
	switch r.Kind {
	case protocol.TurnCompleted:
		return a2a.TaskStateCompleted
	case protocol.TurnAborted:
		return a2a.TaskStateCanceled
	case protocol.TurnBlocked:
		return a2a.TaskStateRejected
	default:
		return a2a.TaskStateFailed
	}
}

func reasonText(r protocol.TurnEndReason) string {
	s := "turn ended " + r.Kind
	if r.Cause != "" {
		s += " (" + r.Cause + ")"
	}
	if r.Error != "" {
		s += ": " + r.Error
	}
	return s
}

func textOf(blocks []protocol.ContentBlock) string {
	var b strings.Builder
	for _, c := range blocks {
		if c.Type == protocol.BlockText && !c.Framing {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

func (f *taskFold) status(msg *a2a.Message) *a2a.TaskStatusUpdateEvent {
	e := a2a.NewStatusUpdateEvent(f, f.state, msg)
	ts := f.updated
	e.Status.Timestamp = &ts
	e.Metadata = f.metadata()
	return e
}

func (f *taskFold) artifact() *a2a.Artifact {
	text := textOf(f.output)
	if text == "" {
		return nil
	}
	return &a2a.Artifact{ID: a2a.ArtifactID("output-" + f.messageID), Name: "output", Parts: a2a.ContentParts{a2a.NewTextPart(text)}}
}

// metadata is the task's Brood facts: its turn, how the turn ended, and its
// usage (ExtUsage).
func (f *taskFold) metadata() map[string]any {
	m := map[string]any{}
	if f.turn != 0 {
		m[metaTurn] = f.turn
	}
	if f.terminal() && f.reason.Kind != "" {
		m[metaStopReason] = f.reason.Kind
		if f.reason.Cause != "" {
			m[metaCause] = f.reason.Cause
		}
	}
	if f.usageSeen {
		m[ExtUsage] = map[string]any{"inputTokens": f.usage.InputTokens, "outputTokens": f.usage.OutputTokens}
	}
	if len(m) == 0 {
		return nil
	}
	return m
}

// task is the fold as an A2A task: its status, its prompt as history (when
// historyLength allows), its output as an artifact once it ended.
func (f *taskFold) task(historyLength *int) *a2a.Task {
	t := &a2a.Task{ID: f.id(), ContextID: f.childID, Status: a2a.TaskStatus{State: f.state}, Metadata: f.metadata()}
	if !f.updated.IsZero() {
		ts := f.updated
		t.Status.Timestamp = &ts
	}
	if f.terminal() && f.reason.Kind != "" && f.reason.Kind != protocol.TurnCompleted {
		t.Status.Message = a2a.NewMessageForTask(a2a.MessageRoleAgent, f, a2a.NewTextPart(reasonText(f.reason)))
	}
	if f.terminal() {
		if a := f.artifact(); a != nil {
			t.Artifacts = []*a2a.Artifact{a}
		}
	}
	if (historyLength == nil || *historyLength > 0) && len(f.prompt) > 0 {
		m := a2a.NewMessageForTask(a2a.MessageRoleUser, f, a2a.NewTextPart(textOf(f.prompt)))
		m.ID = f.messageID
		t.History = append(t.History, m)
		if f.terminal() && len(f.output) > 0 && (historyLength == nil || *historyLength > 1) {
			t.History = append(t.History, a2a.NewMessageForTask(a2a.MessageRoleAgent, f, a2a.NewTextPart(textOf(f.output))))
		}
	}
	return t
}
