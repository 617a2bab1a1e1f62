package agent

import (
	"fmt"
	"strings"

	"github.com/brood-dev/brood/pkg/protocol"
)

// DefaultPersona is the deployment persona unless one is configured.
const DefaultPersona = "You are a Brood agent, a careful assistant working in the directory {{cwd}} with the {{model}} model ({{provider}})."

// SystemPrompt assembles an agent's system prompt: the persona (the child's
// own, shadowing the deployment's, when given), then the runtime context
// statement, then extra sections (tool guidance, structured output).
func SystemPrompt(persona string, vars map[string]string, header protocol.SessionHeader, extra ...string) (string, error) {
	p, err := protocol.RenderTemplate(persona, vars)
	if err != nil {
		return "", err
	}
	var sections []string
	if p != "" {
		sections = append(sections, p)
	}
	if header.ParentSession != "" {
		sections = append(sections, fmt.Sprintf(
			"You are a subagent at delegation depth %d, started by agent %s to do one task. Work only inside %s. No human is watching: do not ask for approvals; finish the task and answer with your result.",
			header.DelegationDepth, header.ParentSession, header.Cwd))
	}
	for _, s := range extra {
		if s != "" {
			sections = append(sections, s)
		}
	}
	return strings.Join(sections, "\n\n"), nil
}
