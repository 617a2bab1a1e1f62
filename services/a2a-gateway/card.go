package a2agateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/brood-dev/brood/internal/buildinfo"
	"github.com/brood-dev/brood/pkg/protocol"
)

// cardTimeout bounds the providers.list behind one card.
const cardTimeout = 10 * time.Second

// bearerScheme names the security scheme of every card.
const bearerScheme a2a.SecuritySchemeName = "bearer"

// serveCard answers GET /agents/<p>/.well-known/agent-card.json with the
// provider's card (public, like every Agent Card: it holds no secret), or
// 404 when no provider of that name is registered.
func (g *Gateway) serveCard(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), cardTimeout)
	defer cancel()
	card, err := g.Card(ctx, r.PathValue("provider"))
	if err != nil {
		code := http.StatusServiceUnavailable
		if protocol.CodeOf(err) == protocol.CodeNoProvider {
			code = http.StatusNotFound
		}
		http.Error(w, err.Error(), code)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(card)
}

// Card is the Agent Card of a provider: its JSON-RPC and HTTP+JSON
// interfaces, bearer authentication, streaming, one skill for the provider
// (from its descriptor) and one per tool its agents use, and the Brood
// extensions (ExtCascadingCancel, ExtUsage). NO_PROVIDER when none of that
// name is registered; a provider that is not continuable is NO_PROVIDER too
// (an A2A context is a continuable child, docs/a2a.md).
func (g *Gateway) Card(ctx context.Context, provider string) (*a2a.AgentCard, error) {
	list, err := g.cfg.Cards.Providers(ctx)
	if err != nil {
		return nil, err
	}
	var desc *protocol.ProviderDescriptor
	for i := range list.Providers {
		if list.Providers[i].Name == provider {
			desc = &list.Providers[i]
		}
	}
	if desc == nil || !desc.Continuable {
		return nil, protocol.Errorf(protocol.CodeNoProvider, "no continuable provider named %q is registered", provider)
	}
	base := g.AgentURL(provider)
	jsonrpc := a2a.NewAgentInterface(base+"/jsonrpc", a2a.TransportProtocolJSONRPC)
	rest := a2a.NewAgentInterface(base+"/rest", a2a.TransportProtocolHTTPJSON)
	return &a2a.AgentCard{
		Name:                provider,
		Description:         describe(*desc),
		Version:             buildinfo.Version,
		DocumentationURL:    "https://github.com/brood-dev/brood/blob/main/docs/a2a.md",
		SupportedInterfaces: []*a2a.AgentInterface{jsonrpc, rest},
		Capabilities: a2a.AgentCapabilities{
			Streaming: true,
			Extensions: []a2a.AgentExtension{
				{URI: ExtCascadingCancel, Description: "CancelTask ends the context's activation and every descendant it started, child first (docs/a2a.md, Extensions)"},
				{URI: ExtUsage, Description: "task metadata carries the turn's model usage under this URI: {inputTokens, outputTokens}; budgets are not enforced yet (docs/a2a.md, Extensions)"},
			},
		},
		DefaultInputModes:    []string{"text/plain"},
		DefaultOutputModes:   []string{"text/plain"},
		SecuritySchemes:      a2a.NamedSecuritySchemes{bearerScheme: a2a.HTTPAuthSecurityScheme{Scheme: "Bearer", Description: "a token the gateway's callers file maps to a Brood user (docs/security.md)"}},
		SecurityRequirements: a2a.SecurityRequirementsOptions{{bearerScheme: {}}},
		Skills:               skills(*desc),
	}, nil
}

func describe(d protocol.ProviderDescriptor) string {
	var caps []string
	if d.Capabilities.OutputSchema {
		caps = append(caps, "structured output")
	}
	if d.InheritsParentContext {
		caps = append(caps, "inherits its parent's context")
	}
	if d.Remote {
		caps = append(caps, "a remote agent")
	}
	s := fmt.Sprintf("Brood provider %q: each A2A context is a continuable Brood child on it; each message is one turn", d.Name)
	if len(caps) > 0 {
		s += " (" + strings.Join(caps, ", ") + ")"
	}
	return s
}

// skills: the provider itself, then one skill per tool of its agents.
func skills(d protocol.ProviderDescriptor) []a2a.AgentSkill {
	out := []a2a.AgentSkill{{
		ID: d.Name, Name: d.Name, Description: describe(d),
		Tags: []string{"brood", "provider"}, InputModes: []string{"text/plain"}, OutputModes: []string{"text/plain"},
	}}
	for _, t := range d.Tools {
		out = append(out, a2a.AgentSkill{
			ID: "tool/" + t, Name: t, Description: fmt.Sprintf("the agent may use the tool %s", t), Tags: []string{"brood", "tool"},
		})
	}
	return out
}
