package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// DefaultSubagentMaxDepth is the subagent tool's default absolute depth cap:
// the root plus three generations (docs/upstream-behaviour.md §1.5, §6).
const DefaultSubagentMaxDepth = 3

// SubagentDisposeTimeout bounds the dispose of a child whose parent's turn was cancelled.
const SubagentDisposeTimeout = 30 * time.Second

// SubagentDeadlineWait bounds how long a foreground subagent call whose
// turn was cut at its budget's deadline waits for its child's own end
// before it disposes the child: the child's deadline is no later than the
// parent's (budgets only tighten down the tree), so it is ending at that
// deadline too, and its result says so (docs/protocol.md §5.5); a dispose
// would make it `aborted`.
const SubagentDeadlineWait = 10 * time.Second

// deadlineCut reports whether ctx was cut at a budget's deadline: the
// turn's own (errBudgetDeadline) or a coordinator's end of the budget's
// subtree (a Cancel with cause deadline).
func deadlineCut(ctx context.Context) bool {
	cause := context.Cause(ctx)
	var c *Cancel
	return errors.Is(cause, errBudgetDeadline) || (errors.As(cause, &c) && c.Cause == protocol.CauseDeadline)
}

// SubagentStartTimeout bounds a foreground start, which a cancelled turn
// waits for (so that the child it created is disposed, never left running).
const SubagentStartTimeout = 30 * time.Second

// SubagentConfig configures the model-facing `subagent` tool (docs/design.md §8;
// docs/upstream-behaviour.md §6). The provider is chosen by configuration only; the
// model never names one.
type SubagentConfig struct {
	Client   *client.Client
	Provider string
	// ToolName defaults to "subagent".
	ToolName string
	// MaxDepth is the absolute depth cap sent with every start (default 3);
	// ProviderManaged sends none (for providers without depthLimit).
	MaxDepth        int64
	ProviderManaged bool
	// InheritsParentContext selects the wording: a fork child sees this
	// conversation, a spawn child does not.
	InheritsParentContext bool
	// Background, when set, runs `run_in_background` delegations as
	// continuable children (see the continuable tools); nil refuses them.
	Background func(ctx context.Context, tc ToolContext, description, prompt string, opts protocol.ContinuableOptions) ToolResult
	// Models lists the models the delegate provider offers ("adapter/id",
	// the default first), named in the tool's `model` input; empty when
	// they are not known here (the input is still accepted and checked by
	// the coordinator).
	Models []string
}

// SubagentTool returns the delegation tool. A foreground call starts a
// one-shot child with the calling agent's credential, waits for its result
// and always disposes it; a completed child's output is the tool result, any
// other stop reason an isError result with a headline, the diagnostic and
// the partial output. Failures never crash the parent's turn.
func SubagentTool(cfg SubagentConfig) *Tool {
	name := cfg.ToolName
	if name == "" {
		name = "subagent"
	}
	maxDepth := cfg.MaxDepth
	if maxDepth == 0 && !cfg.ProviderManaged {
		maxDepth = DefaultSubagentMaxDepth
	}
	desc := "Delegate a self-contained task to a fresh subagent. It does NOT see this conversation: " +
		"write a complete prompt with every fact it needs. It works in the same workspace and returns its final answer."
	promptDesc := "the complete task for the subagent, self-contained"
	if cfg.InheritsParentContext {
		desc = "Delegate a task to a subagent that starts with this conversation's completed turns as context. " +
			"It works in the same workspace and returns its final answer."
		promptDesc = "the task for the subagent; it builds on this conversation"
	}
	props := `"description":{"type":"string","description":"a 3-5 word label for the task"},` +
		`"prompt":{"type":"string","description":` + quote(promptDesc) + `}`
	modelDesc := "the model the subagent runs on, among those its provider offers; default: yours when offered, else the provider's default"
	if len(cfg.Models) > 0 {
		modelDesc += " (offered: " + strings.Join(cfg.Models, ", ") + ")"
	}
	props += `,"model":{"type":"string","description":` + quote(modelDesc) + `}` +
		`,"limits":{"type":"object","description":"lower turn limits for the subagent (never above yours)","properties":{` +
		`"turnTimeoutMs":{"type":"integer","minimum":1,"description":"milliseconds one turn may take"},` +
		`"stepsPerTurnMax":{"type":"integer","minimum":1,"description":"model calls one turn may make"},` +
		`"toolCallsPerStepMax":{"type":"integer","minimum":1,"description":"tool calls one model answer may ask for"}},"additionalProperties":false}` +
		`,"requestTimeoutMs":{"type":"integer","minimum":1,"description":"milliseconds each approval or question of the subagent (and its own subagents) waits for an answer before it counts as a denial; never above yours"}` +
		`,"budget":{"type":"object","description":"a budget for the subagent and everything it delegates, at most what remains of yours (without one it draws on yours)","properties":{` +
		`"tokens":{"type":"integer","minimum":1,"description":"input plus output tokens"},` +
		`"modelRequests":{"type":"integer","minimum":1,"description":"model requests"},` +
		`"toolCalls":{"type":"integer","minimum":1,"description":"tool calls"},` +
		`"children":{"type":"integer","minimum":1,"description":"subagents started in total"},` +
		`"deadlineMs":{"type":"integer","minimum":1,"description":"milliseconds from now the work may take"}},"additionalProperties":false}`
	if cfg.Background != nil {
		desc += " Set run_in_background to start a continuable subagent and go on; you get a notice when it settles, and can message it with send_message."
		props += `,"run_in_background":{"type":"boolean","description":"start the subagent in the background (continuable) instead of waiting for it"}`
	}
	return &Tool{
		Name:        name,
		Description: desc,
		Delegates:   true,
		Available: func(h protocol.SessionHeader) bool {
			if cfg.ProviderManaged {
				return MayDelegate(h, 0)
			}
			return MayDelegate(h, maxDepth)
		},
		Parameters: json.RawMessage(`{"type":"object","properties":{` + props + `},"required":["description","prompt"],"additionalProperties":false}`),
		Run: func(ctx context.Context, tc ToolContext, args string) ToolResult {
			var in struct {
				Description string               `json:"description"`
				Prompt      string               `json:"prompt"`
				Background  *bool                `json:"run_in_background"`
				Model       string               `json:"model"`
				Limits      *protocol.TurnLimits `json:"limits"`
				// RequestTimeoutMs is StartOptions.RequestTimeoutMs.
				RequestTimeoutMs int64 `json:"requestTimeoutMs"`
				// Budget is StartOptions.Budget.
				Budget *protocol.Budget `json:"budget"`
			}
			if err := decodeArgs(args, &in); err != nil {
				return ErrorResult("%s: %v", name, err)
			}
			if strings.TrimSpace(in.Prompt) == "" || strings.TrimSpace(in.Description) == "" {
				return ErrorResult("%s: description and prompt are both required", name)
			}
			if in.Background != nil && *in.Background {
				if cfg.Background == nil {
					return ErrorResult("%s: run_in_background is not available with this provider", name)
				}
				return cfg.Background(ctx, tc, in.Description, in.Prompt, protocol.ContinuableOptions{Model: in.Model, Limits: in.Limits, RequestTimeoutMs: in.RequestTimeoutMs, Budget: in.Budget})
			}
			opts := protocol.StartOptions{Label: in.Description, Model: in.Model, Limits: in.Limits, RequestTimeoutMs: in.RequestTimeoutMs, Budget: in.Budget}
			if !cfg.ProviderManaged {
				opts.MaxDepth = maxDepth
			}
			parent := protocol.ParentRef{SessionID: tc.Header.ID, Credential: tc.Credential}
			// The start is not abandoned when the turn is cancelled meanwhile:
			// a child created after its parent stopped listening would run
			// unseen; its run is learnt, then disposed below.
			sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), SubagentStartTimeout)
			run, err := cfg.Client.StartRun(sctx, protocol.RunStartRequest{Provider: cfg.Provider, Parent: parent, Prompt: protocol.Text(in.Prompt), Options: opts})
			scancel()
			if err != nil {
				return ErrorResult("The subagent could not be started: %v", err)
			}
			res, err := run.Result(ctx)
			if err != nil && deadlineCut(ctx) {
				wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), SubagentDeadlineWait)
				res, err = run.Result(wctx)
				wcancel()
			}
			if err != nil {
				// The parent's turn was cancelled: dispose the child and report how it ended.
				st, derr := disposeRun(ctx, cfg.Client, run, parent)
				if derr != nil || st.Result == nil {
					return ErrorResult("The subagent %s was cancelled; disposing it failed: %v", run.ChildID, derr)
				}
				res = *st.Result
			}
			out := resultToTool(run.ChildID, res)
			out.Meta = map[string]string{"runId": run.RunID, "childId": run.ChildID, "stopReason": string(res.StopReason)}
			out.ChildUsage = res.Usage
			return out
		},
	}
}

// MayDelegate reports whether a session with header h can start a child
// through a subagent tool that sends maxDepth (0: none, provider-managed):
// the child's depth, h's depth plus one, must not exceed the smaller of the
// header's depth cap and maxDepth (the coordinator's DEPTH_EXCEEDED rule,
// docs/upstream-behaviour.md §1.5). A session at its cap is not offered the tool at
// all (Brood's departure from upstream, which kept it visible and failed the
// call).
func MayDelegate(h protocol.SessionHeader, maxDepth int64) bool {
	child := h.DelegationDepth + 1
	if h.DepthCap != nil && child > *h.DepthCap {
		return false
	}
	return maxDepth <= 0 || child <= maxDepth
}

// resultToTool maps a child's result to the parent's tool result
// (docs/upstream-behaviour.md §6, result mapping).
func resultToTool(childID string, res protocol.SubagentResult) ToolResult {
	text := protocol.PlainText(res.Output)
	if res.StopReason == protocol.StopCompleted {
		if text == "" {
			text = "(the subagent finished without output)"
		}
		if note := sessionlog.EarlierOutputNote(res.OutputFrom); note != "" {
			text += "\n\n" + note
		}
		return TextResult(text)
	}
	var b strings.Builder
	switch res.StopReason {
	case protocol.StopAborted:
		b.WriteString("The subagent was cancelled before it finished.")
	case protocol.StopError:
		b.WriteString("The subagent failed.")
	case protocol.StopMaxTokens:
		b.WriteString("The subagent hit its token limit before it finished.")
	case protocol.StopRefusal:
		b.WriteString("The subagent declined the task.")
	default:
		fmt.Fprintf(&b, "The subagent ended abnormally (%s).", res.StopReason)
	}
	fmt.Fprintf(&b, " (subagent %s)", childID)
	if res.Diagnostic != "" || res.ErrorCode != "" {
		b.WriteString("\nDiagnostic: ")
		if res.ErrorCode != "" {
			b.WriteString(string(res.ErrorCode) + " ")
		}
		b.WriteString(res.Diagnostic)
	}
	if text != "" {
		b.WriteString("\nPartial output before the run ended:\n" + text)
	}
	return ToolResult{Content: protocol.Text(b.String()), IsError: true}
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
