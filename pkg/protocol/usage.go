package protocol

// RunUsage is what one run, epoch or turn spent, or (as a subtree figure)
// what it and every delegation under it spent (docs/protocol.md §6.6).
// Counts are exact folds over session logs, never estimates:
//
//   - ModelRequests: the steps (step/start events), one model request each
//     (for an ACP child, one per turn: the agent is the model);
//   - InputTokens, OutputTokens: the sums of the usage the steps reported;
//   - UnreportedRequests: the model requests whose tokens are unknown (the
//     step logged no usage, or usage marked unknown: a cut or failed
//     request, an ACP agent that sends none), so the token sums are a lower
//     bound whenever it is not 0;
//   - ToolCalls: the tool/call events;
//   - WallMs: agent time in milliseconds, each turn's turn/end time less its
//     turn/start time; a subtree's is the sum over its runs (work time, not
//     elapsed time: parallel children add up).
type RunUsage struct {
	InputTokens        int64 `msgpack:"inputTokens" json:"inputTokens"`
	OutputTokens       int64 `msgpack:"outputTokens" json:"outputTokens"`
	ModelRequests      int64 `msgpack:"modelRequests" json:"modelRequests"`
	UnreportedRequests int64 `msgpack:"unreportedRequests,omitempty" json:"unreportedRequests,omitempty"`
	ToolCalls          int64 `msgpack:"toolCalls" json:"toolCalls"`
	WallMs             int64 `msgpack:"wallMs" json:"wallMs"`
}

// Add returns u plus v, field by field.
func (u RunUsage) Add(v RunUsage) RunUsage {
	return RunUsage{
		InputTokens:        u.InputTokens + v.InputTokens,
		OutputTokens:       u.OutputTokens + v.OutputTokens,
		ModelRequests:      u.ModelRequests + v.ModelRequests,
		UnreportedRequests: u.UnreportedRequests + v.UnreportedRequests,
		ToolCalls:          u.ToolCalls + v.ToolCalls,
		WallMs:             u.WallMs + v.WallMs,
	}
}

// Tokens is InputTokens plus OutputTokens.
func (u RunUsage) Tokens() int64 { return u.InputTokens + u.OutputTokens }

// UsageSummary is a result's usage (docs/protocol.md §6.6): Own, what the
// child itself spent in the run or epoch (a fold over its own log), and
// Subtree, Own plus the Subtree of every delegation that ended into its log
// in that run or epoch, each counted once.
type UsageSummary struct {
	Own     RunUsage `msgpack:"own" json:"own"`
	Subtree RunUsage `msgpack:"subtree" json:"subtree"`
}
