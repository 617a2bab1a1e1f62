package coordinator

// Admission (docs/design.md §7): the checks a start passes before anything is
// written, in the design's order, and a user's open roots
// (Config.UserOpenRootsMax, openroots.go). The live-children slots are slots.go.

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/brood-dev/brood/pkg/protocol"
)

// admission is a validated start: everything the child's header and the
// provider need.
type admission struct {
	desc     protocol.ProviderDescriptor
	parent   leaseState
	pheader  protocol.SessionHeader
	depth    int64
	depthCap *int64
	ceiling  *protocol.ToolFilter
	options  protocol.ResolvedOptions
	// autoApprove is the child's header autoApprove (protocol.ResolveAutoApprove).
	autoApprove []string
}

// admit runs the start checks in docs/design.md §7's order, all before anything is
// created: provider → capabilities → parent authority → maxDepth domain →
// depth cap and ceilings → schema subset → tool filter → persona.
func (c *Coordinator) admit(ctx context.Context, providerName string, parent protocol.ParentRef, prompt []protocol.ContentBlock, o protocol.StartOptions) (admission, error) {
	desc, err := c.lookupProvider(providerName)
	if err != nil {
		return admission{}, err
	}
	return c.admitWith(ctx, desc, parent, prompt, o)
}

// lookupProvider resolves a provider name to its live descriptor:
// NO_PROVIDER when no host ever registered it (or every one stopped),
// UNAVAILABLE while its registered instances are all silent (dispatch.go).
func (c *Coordinator) lookupProvider(name string) (protocol.ProviderDescriptor, error) {
	if name == "" {
		return protocol.ProviderDescriptor{}, protocol.Errorf(protocol.CodeInvalidArgument, "provider is required")
	}
	desc, ok := c.reg.provider(name)
	if !ok {
		return desc, c.noInstance(name)
	}
	return desc, nil
}

// admitWith runs the checks after the provider lookup against desc, whose
// capability flags decide what options are honoured.
func (c *Coordinator) admitWith(ctx context.Context, desc protocol.ProviderDescriptor, parent protocol.ParentRef, prompt []protocol.ContentBlock, o protocol.StartOptions) (admission, error) {
	var a admission
	a.desc = desc
	if err := checkCapabilities(desc, o); err != nil {
		return a, err
	}
	l, err := c.authorize(ctx, parent)
	if err != nil {
		return a, err
	}
	a.parent = l
	// A first, cheap look at the limit (the slot record decides, slots.go);
	// children this replica's cache still counts are read fresh before a
	// refusal, since a run's result comes before its lease goes.
	if live := c.liveChildIDs(parent.SessionID); len(live) >= c.cfg.LiveChildrenMax {
		if n := len(live) - len(c.endedChildren(ctx, nil, live)); n >= c.cfg.LiveChildrenMax {
			return a, protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
				"limit": "live children per parent", "reason": fmt.Sprintf("session %s already has %d live children; the limit is %d", parent.SessionID, n, c.cfg.LiveChildrenMax)})
		}
	}
	var maxDepth *int64
	if o.MaxDepth != nil {
		v, err := ParseMaxDepth(o.MaxDepth)
		if err != nil {
			return a, err
		}
		maxDepth = &v
	}
	if err := c.checkPrompt(prompt); err != nil {
		return a, err
	}
	a.pheader, err = c.headers.get(ctx, c.st, parent.SessionID)
	if err != nil {
		return a, protocol.Errorf(protocol.CodeUnavailable, "read the parent's header: %w", err)
	}
	a.depth, a.depthCap, err = resolveDepth(a.pheader, maxDepth)
	if err != nil {
		return a, err
	}
	if o.OutputSchema != nil {
		schema, err := c.checkSchema(o.OutputSchema)
		if err != nil {
			return a, err
		}
		a.options.OutputSchema = schema
	}
	a.ceiling = a.pheader.ToolCeiling
	if o.ToolFilter != nil {
		if err := checkToolFilter(desc, a.pheader.ToolCeiling, *o.ToolFilter); err != nil {
			return a, err
		}
		a.ceiling = intersectCeiling(a.pheader.ToolCeiling, o.ToolFilter)
		a.options.ToolFilter = o.ToolFilter
	}
	if a.autoApprove, err = protocol.ResolveAutoApprove(a.pheader, o.AutoApprove, desc.Tools); err != nil {
		return a, err
	}
	if o.Persona != nil {
		if err := protocol.ValidatePersona(*o.Persona); err != nil {
			return a, err
		}
		a.options.Persona = o.Persona
	}
	if len(o.Label) > protocol.LabelBytesMax {
		return a, protocol.Errorf(protocol.CodeInvalidArgument, "label is longer than %d bytes", protocol.LabelBytesMax)
	}
	a.options.Label = o.Label
	return a, nil
}

// checkSchema validates an outputSchema against the supported subset
// (docs/upstream-behaviour.md §1.6; UNSUPPORTED_SCHEMA lists every offending path)
// and returns its canonical JSON text.
func (c *Coordinator) checkSchema(schema any) (string, error) {
	return protocol.CheckOutputSchema(schema)
}

// checkPrompt checks a prompt, followup message or report: text blocks only,
// each UTF-8 (docs/protocol.md §5 and §10; raw bytes from a msgpack client are
// refused here, for every client: issue 37, item 4), not empty, at most
// PromptBytesMax bytes in all.
func (c *Coordinator) checkPrompt(prompt []protocol.ContentBlock) error {
	size := 0
	for i, b := range prompt {
		if b.Type != protocol.BlockText {
			return protocol.Errorf(protocol.CodeInvalidArgument, "prompt block type %q is not supported; use text blocks", b.Type)
		}
		if !utf8.ValidString(b.Text) {
			return protocol.Errorf(protocol.CodeInvalidArgument, "prompt block %d is not UTF-8 text", i)
		}
		size += len(b.Text)
	}
	if len(prompt) == 0 || size == 0 {
		return protocol.Errorf(protocol.CodeInvalidArgument, "prompt is empty")
	}
	if size > c.cfg.PromptBytesMax {
		return protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
			"limit": "prompt bytes", "reason": fmt.Sprintf("the prompt is %d bytes; the limit is %d", size, c.cfg.PromptBytesMax)})
	}
	return nil
}

// validNotify checks a client-chosen notify subject: printable ASCII literal
// tokens, at most protocol.NotifySubjectBytesMax bytes, and never a subject of the deployment itself or
// of the system ($JS, $KV, $SRV…): the settling host publishes there with its
// own permissions, so a notify subject must not reach Brood's state.
func (c *Coordinator) validNotify(s string) bool {
	if s == "" || len(s) > protocol.NotifySubjectBytesMax || strings.HasPrefix(s, "$") || strings.HasPrefix(s, c.subj.Prefix()+".") {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r > '~' || r == '*' || r == '>' {
			return false
		}
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" {
			return false
		}
	}
	return true
}
