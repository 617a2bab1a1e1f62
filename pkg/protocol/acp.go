package protocol

import (
	"encoding/json"
	"fmt"
)

// This file is the part of the wire contract that concerns ACP (the Agent
// Client Protocol, docs/design.md §6): the log event that records an ACP child's
// remote session, the lineage the ACP bridge passes in the `_meta` of
// `session/new`, and the roots that `brood acp-agent` opens for its ACP
// sessions.

// EvACPSession is the log-only event the ACP bridge appends once the remote
// agent answered `session/new` (or `session/load`): the ACP session id a
// later turn prompts again, and whether the agent can load it after a
// restart. It never reaches model history.
const EvACPSession = "acp/session"

// ACPSessionData is the data of acp/session. SessionID is the agent's ACP
// session id; LoadSession records whether the agent advertised `session/load`
// when this session was created or loaded (a cold resume without it is
// NOT_RESUMABLE); Loaded marks a session that was re-attached with
// `session/load` rather than created; Agent is the agent's self-description
// (`agentInfo` name and version) when it sent one.
type ACPSessionData struct {
	SessionID       string `msgpack:"sessionId" json:"sessionId"`
	LoadSession     bool   `msgpack:"loadSession" json:"loadSession"`
	Loaded          bool   `msgpack:"loaded,omitempty" json:"loaded,omitempty"`
	ProtocolVersion int64  `msgpack:"protocolVersion" json:"protocolVersion"`
	Agent           string `msgpack:"agent,omitempty" json:"agent,omitempty"`
}

// ACPMetaKey is the key under `_meta` of `session/new` where the ACP bridge
// puts an ACPLineage, so a Brood ACP agent never resets a depth limit or a
// tool ceiling (docs/design.md §7).
const ACPMetaKey = "brood"

// ACPLineage is the delegation an ACP child serves, as the ACP bridge passes
// it to the agent (from the child's header): the delegating parent, the
// child's delegation depth, and the ceilings every ancestor narrowed. A Brood
// ACP agent opens its session's root with it; the coordinator only ever
// narrows a root with it (RootLineage), never widens.
type ACPLineage struct {
	ParentSession   string      `json:"parentSession"`
	DelegationDepth int64       `json:"delegationDepth"`
	DepthCap        *int64      `json:"depthCap,omitempty"`
	ToolCeiling     *ToolFilter `json:"toolCeiling,omitempty"`
}

// LineageOfHeader is the lineage an ACP child with header h passes on.
func LineageOfHeader(h SessionHeader) ACPLineage {
	return ACPLineage{ParentSession: h.ParentSession, DelegationDepth: h.DelegationDepth, DepthCap: h.DepthCap, ToolCeiling: h.ToolCeiling}
}

// Meta renders l as the `_meta` object of a `session/new` request.
func (l ACPLineage) Meta() map[string]any {
	return map[string]any{ACPMetaKey: l}
}

// LineageFromMeta reads the lineage from the `_meta` of `session/new`; nil
// when there is none. A present but malformed entry is an error, so a bad
// claim never silently becomes "no limits".
func LineageFromMeta(meta map[string]any) (*ACPLineage, error) {
	raw, ok := meta[ACPMetaKey]
	if !ok || raw == nil {
		return nil, nil
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("_meta.%s: %w", ACPMetaKey, err)
	}
	var l ACPLineage
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("_meta.%s is not a Brood lineage: %w", ACPMetaKey, err)
	}
	return &l, nil
}

// RootLineage narrows a root opened with agents.open to the delegation it
// serves (a Brood ACP agent driven by the ACP bridge). The coordinator checks
// that ParentSession exists and takes, for each field, the narrower of the
// claim and what the parent's header implies: depth at least the parent's
// plus one, cap at most the parent's, ceiling intersected with the parent's.
type RootLineage struct {
	ParentSession   string      `msgpack:"parentSession" json:"parentSession"`
	DelegationDepth int64       `msgpack:"delegationDepth" json:"delegationDepth"`
	DepthCap        *int64      `msgpack:"depthCap,omitempty" json:"depthCap,omitempty"`
	ToolCeiling     *ToolFilter `msgpack:"toolCeiling,omitempty" json:"toolCeiling,omitempty"`
}

// OriginReopenable marks the header of a root opened with
// AgentsOpenRequest.Reopenable: a later agents.open naming its session id may
// make it live again once no live agent holds it (`session/load` of
// `brood acp-agent` after a restart). No other session can be reopened.
const OriginReopenable = "reopenable-root"

// LastACPSession returns the data of the last acp/session event in events:
// the ACP session a continuable ACP child prompts again, and whether its
// agent can load it after a restart.
func LastACPSession(events []SessionEvent) (ACPSessionData, bool) {
	for i := len(events) - 1; i >= 0; i-- {
		if events[i].Type != EvACPSession {
			continue
		}
		var d ACPSessionData
		if events[i].Decode(&d) == nil && d.SessionID != "" {
			return d, true
		}
	}
	return ACPSessionData{}, false
}

// EvACPPermission is the log-only event the ACP bridge appends for every
// `session/request_permission` an ACP child sent, with the answer it got
// (issue 14): the provider's policy decides, reject or allow without asking
// anyone, or ask through a request for approval (issue 33; its
// request/open and request/answer come before this event), and a child's
// tool ceiling that denies any tool rejects (docs/protocol.md §8.8).
// Results count these events (SubagentResult.Permissions).
const EvACPPermission = "acp/permission"

// ACPPermissionOption is one option the agent offered.
type ACPPermissionOption struct {
	OptionID string `msgpack:"optionId" json:"optionId"`
	Kind     string `msgpack:"kind" json:"kind"`
	Name     string `msgpack:"name" json:"name"`
}

// ACPPermissionData is the data of acp/permission. Turn (and Step) is the
// turn the request arrived in, or, for a request after that turn was sealed,
// the turn it belongs to (Late). ToolCallID and Title name what the agent
// wanted to do; Options are what it offered. The answer: Outcome "selected"
// with OptionID and OptionKind, or "cancelled" (when no offered option fits
// the decision); Granted says whether the agent was allowed (an allow
// option was selected); Policy is the policy applied (reject, allow or ask)
// and Why the reason it applied, or how the request for approval ended.
type ACPPermissionData struct {
	Turn       int64                 `msgpack:"turn" json:"turn"`
	Step       int64                 `msgpack:"step" json:"step"`
	Late       bool                  `msgpack:"late,omitempty" json:"late,omitempty"`
	ToolCallID string                `msgpack:"toolCallId" json:"toolCallId"`
	Title      string                `msgpack:"title,omitempty" json:"title,omitempty"`
	Options    []ACPPermissionOption `msgpack:"options" json:"options"`
	Policy     string                `msgpack:"policy" json:"policy"`
	Why        string                `msgpack:"why" json:"why"`
	Outcome    string                `msgpack:"outcome" json:"outcome"`
	OptionID   string                `msgpack:"optionId,omitempty" json:"optionId,omitempty"`
	OptionKind string                `msgpack:"optionKind,omitempty" json:"optionKind,omitempty"`
	Granted    bool                  `msgpack:"granted" json:"granted"`
}

// EvACPLateUpdate is the log-only event the ACP bridge appends for output an
// ACP agent sent after the turn it belongs to was sealed (issue 14): after a
// `session/prompt` is answered the bridge waits for a short quiet period, and
// what arrives in it still counts for the turn; what arrives later, before
// the next prompt is sent, is recorded here against that turn, never the
// next one, and is not part of any output.
const EvACPLateUpdate = "acp/late-update"

// ACPLateUpdateData is the data of acp/late-update. Kind is the ACP update
// kind (agent_message_chunk, tool_call, tool_call_update, …); Text is the
// message text (consecutive chunks joined; cut to 64 KiB with OmittedBytes
// counting the rest); ToolCallID, Title and Status describe a tool call.
type ACPLateUpdateData struct {
	Turn         int64  `msgpack:"turn" json:"turn"`
	Kind         string `msgpack:"kind" json:"kind"`
	Text         string `msgpack:"text,omitempty" json:"text,omitempty"`
	OmittedBytes int64  `msgpack:"omittedBytes,omitempty" json:"omittedBytes,omitempty"`
	ToolCallID   string `msgpack:"toolCallId,omitempty" json:"toolCallId,omitempty"`
	Title        string `msgpack:"title,omitempty" json:"title,omitempty"`
	Status       string `msgpack:"status,omitempty" json:"status,omitempty"`
}

// ACPPromptMeta is what the ACP bridge puts under `_meta.brood` of
// `session/prompt` for a Brood ACP agent: the prompt's provenance (who sent
// it: the user, a parent agent's relay, a report), so the agent logs the
// message with its real source instead of `user`. Provenance only, never
// authority (docs/design.md §7).
type ACPPromptMeta struct {
	Source *MessageSource `json:"source,omitempty"`
}

// ACPTurnEnd is what a Brood ACP agent puts under `_meta.brood.turnEnd` of a
// `session/prompt` response whose turn failed: ACP has no stop reason for an
// error, so the response says `end_turn` (an editor shows the error text
// streamed before it), and this records the real end for the ACP bridge,
// which logs the turn `error` with Error as its diagnostic.
type ACPTurnEnd struct {
	Kind  string `json:"kind"`
	Error string `json:"error,omitempty"`
}

// ACPNoticeTurnError is the `_meta.brood.notice` of the agent message chunk
// in which a Brood ACP agent tells an editor why a turn failed (see
// ACPTurnEnd); the ACP bridge leaves that text out of the child's answer.
const ACPNoticeTurnError = "turn-error"

// ACPMetaOf decodes `_meta.brood` into v; false when there is none or it does
// not decode (a foreign agent's `_meta` is never trusted to mean anything).
func ACPMetaOf(meta map[string]any, v any) bool {
	raw, ok := meta[ACPMetaKey]
	if !ok || raw == nil {
		return false
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return false
	}
	return json.Unmarshal(b, v) == nil
}
