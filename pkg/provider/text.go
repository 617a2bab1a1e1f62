package provider

import (
	"context"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Roles of a text provider's messages.
const (
	RoleUser      = model.RoleUser
	RoleAssistant = model.RoleAssistant
)

// Message is one message of a child's conversation as a text provider sees
// it: Role is RoleUser or RoleAssistant, Text its text blocks' text joined by
// newlines (protocol.PlainText).
type Message struct {
	Role string
	Text string
}

// Turn is one turn of a text provider's child: the child's id and workspace
// (its parent's cwd; docs/protocol.md §8.1) and the conversation so far,
// oldest first, whose last message is this turn's user message (the start's
// prompt, or a followup).
type Turn struct {
	ChildID  string
	Cwd      string
	Messages []Message
}

// Prompt returns the text of the turn's user message.
func (t Turn) Prompt() string {
	if len(t.Messages) == 0 {
		return ""
	}
	return t.Messages[len(t.Messages)-1].Text
}

// AnswerFunc answers one turn with text. ctx ends when the turn is
// interrupted, disposed or times out (10 minutes) and when the host loses the
// child: the function should then return promptly. An error ends the turn
// `error` with the error's text as its diagnostic (keep secrets out of it).
type AnswerFunc func(ctx context.Context, t Turn) (string, error)

// NewText returns a provider named name (^[A-Za-z0-9_-]{1,64}$) whose
// children answer each turn with answer's text. Its children are
// continuable; it accepts no start capability (outputSchema, depthLimit,
// toolFilter, persona are refused by the coordinator) and offers no tools.
// The host logs each turn as it logs an agent's (turn/start, user/message,
// step/start, assistant/message, step/end, turn/end; docs/protocol.md §8.3),
// so `brood log`, results, followups and host-loss cover its children.
func NewText(name string, answer AnswerFunc) Provider {
	return &textProvider{
		desc:   protocol.ProviderDescriptor{Name: name, Continuable: true},
		answer: answer,
	}
}

type textProvider struct {
	desc   protocol.ProviderDescriptor
	answer AnswerFunc
}

func (p *textProvider) Descriptor() protocol.ProviderDescriptor { return p.desc }

// NewSession composes the child as a Brood agent whose "model" is the
// answer function, without tools.
func (p *textProvider) NewSession(ctx context.Context, spec SessionSpec) (Session, error) {
	m := &textModel{name: p.desc.Name, answer: p.answer, child: spec.Header.ID, cwd: spec.Header.Cwd}
	d := &worker.InProcess{
		Desc:   p.desc,
		Models: func() (model.Model, error) { return m, nil },
		Tools:  func(SessionSpec) ([]*agent.Tool, error) { return nil, nil },
	}
	return d.NewSession(ctx, spec)
}

// textModel is an AnswerFunc behind the agent runtime's model interface.
type textModel struct {
	name       string
	answer     AnswerFunc
	child, cwd string
}

func (*textModel) Provider() string { return "text" }
func (m *textModel) Name() string   { return m.name }
func (m *textModel) Stream(ctx context.Context, req model.Request, onText func(string)) (model.Response, error) {
	t := Turn{ChildID: m.child, Cwd: m.cwd}
	for _, msg := range req.Messages {
		if msg.Role == model.RoleUser || msg.Role == model.RoleAssistant {
			t.Messages = append(t.Messages, Message{Role: msg.Role, Text: protocol.PlainText(msg.Content)})
		}
	}
	text, err := m.answer(ctx, t)
	if err != nil {
		if ctx.Err() != nil {
			return model.Response{}, ctx.Err()
		}
		return model.Response{}, &model.Error{Diagnostic: err.Error()}
	}
	if text != "" {
		onText(text)
	}
	return model.Response{Message: protocol.AssistantMessage{Content: protocol.Text(text)}, Finish: model.FinishStop}, nil
}
