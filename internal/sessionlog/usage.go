package sessionlog

import "github.com/brood-dev/brood/pkg/protocol"

// OwnUsage folds what a session spent in events, its own (after any seed)
// events of one run, epoch or turn (docs/protocol.md §6.6): one model
// request per step/start; the tokens of each step's reported usage (an
// assistant/message's usage not marked unknown; the first one of a step
// counts); a model request whose step logged no such usage is unreported;
// one tool call per tool/call; wall time as each turn's turn/end time less
// its turn/start time (a turn still open adds nothing).
func OwnUsage(events []protocol.SessionEvent) protocol.RunUsage {
	type stepKey struct{ turn, step int64 }
	var u protocol.RunUsage
	steps := map[stepKey]bool{} // step → its tokens were reported
	var order []stepKey
	turnStart := map[int64]int64{}
	for _, ev := range events {
		switch ev.Type {
		case protocol.EvStepStart:
			var d protocol.StepData
			if ev.Decode(&d) != nil {
				continue
			}
			k := stepKey{d.Turn, d.Step}
			if _, seen := steps[k]; !seen {
				steps[k] = false
				order = append(order, k)
			}
		case protocol.EvAssistantMessage:
			var d protocol.AssistantMessageData
			if ev.Decode(&d) != nil || d.Usage == nil || d.Usage.Unknown {
				continue
			}
			k := stepKey{d.Turn, d.Step}
			if reported, ok := steps[k]; ok && !reported {
				steps[k] = true
				u.InputTokens += d.Usage.InputTokens
				u.OutputTokens += d.Usage.OutputTokens
			}
		case protocol.EvToolCall:
			u.ToolCalls++
		case protocol.EvTurnStart:
			var d protocol.TurnData
			if ev.Decode(&d) == nil {
				turnStart[d.Turn] = ev.Time
			}
		case protocol.EvTurnEnd:
			var d protocol.TurnEndData
			if ev.Decode(&d) != nil {
				continue
			}
			if start, ok := turnStart[d.Turn]; ok && ev.Time >= start {
				u.WallMs += ev.Time - start
				delete(turnStart, d.Turn)
			}
		}
	}
	u.ModelRequests = int64(len(order))
	for _, k := range order {
		if !steps[k] {
			u.UnreportedRequests++
		}
	}
	return u
}

// Usage folds events, a session's own events of one run, epoch or turn,
// into its usage summary (docs/protocol.md §6.6): Own is OwnUsage(events);
// Subtree is Own plus the Subtree of every delegation that ended into
// these events, each counted once: a foreground child's, logged with the
// subagent tool's result (tool/result childUsage, once per runId, else per
// callId), and a background child's, logged with its subagent-settled
// notice (the source's usage on agent/inbox/enqueue or user/message, once
// per messageId, whether the item was claimed or discarded).
func Usage(events []protocol.SessionEvent) protocol.UsageSummary {
	own := OwnUsage(events)
	sub := own
	seen := map[string]bool{}
	add := func(key string, u *protocol.UsageSummary) {
		if u == nil || seen[key] {
			return
		}
		seen[key] = true
		sub = sub.Add(u.Subtree)
	}
	for _, ev := range events {
		switch ev.Type {
		case protocol.EvToolResult:
			var d protocol.ToolResultData
			if ev.Decode(&d) != nil || d.ChildUsage == nil {
				continue
			}
			key := "call:" + d.CallID
			if id := d.Meta["runId"]; id != "" {
				key = "run:" + id
			}
			add(key, d.ChildUsage)
		case protocol.EvInboxEnqueue:
			var d protocol.InboxEnqueueData
			if ev.Decode(&d) == nil && d.Source.Kind == protocol.SourceSubagentSettled {
				add("msg:"+d.MessageID, d.Source.Usage)
			}
		case protocol.EvUserMessage:
			var d protocol.UserMessageData
			if ev.Decode(&d) == nil && d.Source.Kind == protocol.SourceSubagentSettled {
				add("msg:"+d.ID, d.Source.Usage)
			}
		}
	}
	return protocol.UsageSummary{Own: own, Subtree: sub}
}
