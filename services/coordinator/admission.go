package coordinator

// Admission: where a start is admitted (docs/design.md §7; RELIABILITY.md,
// I4 and I8). One pipeline, read top to bottom; every check passes before
// anything is written, and a refusal is an error with its code
// (docs/protocol.md §4):
//
//  0. the request's rate and prompt bytes per user: quotas.go, around
//     every endpoint (rateLimited), before the handler runs;
//  1. validate: the notify subject (checkNotify), the provider
//     (lookupProvider) and its capabilities, the prompt, maxDepth, the
//     output schema, the tool filter, the persona and the label (admitWith;
//     the checks themselves are validate.go and pkg/protocol's);
//  2. authority: the parent's credential against the cached lease
//     (authorize, in admitWith) and then against the bucket's leader
//     (authorizeFresh, in reserveAuthorized; authority.go);
//  3. quotas and slots: a first look at the parent's live children
//     (admitWith), then the slot record's compare-and-set (reserveChild,
//     slots.go, over the slotrecord package), taken together with the fresh
//     authority read;
//  4. write: the child's header and run record (createRun);
//  5. dispatch: the provider start to one live instance, another on a
//     timeout (dispatch.go), and what became of a run whose answer was
//     lost (claimedRun, runs.go).
//
// runsStart below is the one-shot pipeline. A continuable start
// (continuableStart, continuable.go) runs the same admit, then its own
// write and first epoch; a root's open (agentsOpen, roots.go) takes a
// user's open-root slot (openroots.go).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// runsStart admits a one-shot run, writes the child's header and run record,
// asks a provider instance to publish the child, and answers {runId, childId}
// at publication (docs/design.md §7).
func (c *Coordinator) runsStart(ctx context.Context, req rpc.Request, r protocol.RunStartRequest) (protocol.RunStartReply, error) {
	began := time.Now()
	if err := c.checkNotify(req, r.Notify); err != nil {
		return protocol.RunStartReply{}, err
	}
	var err error
	if r.Options.Label, err = protocol.OneLabel(r.Label, r.Options.Label); err != nil {
		return protocol.RunStartReply{}, err
	}
	a, full, err := c.admitRun(ctx, r)
	if err != nil {
		return protocol.RunStartReply{}, err
	}
	childID := ulid.Make().String()
	runID := childID // local providers: the run id is the child's session id (seed: SubagentRun.id)
	if a.desc.Remote {
		runID = ulid.Make().String() // remote providers: a fresh id in the parent's namespace
	}
	// At the limit, or behind starts that wait already (first in, first
	// out), the start waits in its parent's queue (startqueue.go).
	if c.queueOn() && (full || c.agents.hasQueue(a.pheader.ID)) {
		return c.queueStart(ctx, a, req, r, runID, childID)
	}
	if err := c.reserveAuthorized(ctx, r.Parent, a.pheader.ID, childID); err != nil {
		if c.queueOn() && protocol.CodeOf(err) == protocol.CodeLimitExceeded {
			return c.queueStart(ctx, a, req, r, runID, childID)
		}
		return protocol.RunStartReply{}, err
	}
	refund, err := c.admitBudget(ctx, a, childID)
	if err != nil {
		c.releaseChild(ctx, a.pheader.ID, childID)
		return protocol.RunStartReply{}, err
	}
	release := func() { c.releaseChild(ctx, a.pheader.ID, childID); refund() }
	start, runRev, err := c.createRun(ctx, a, req, r, runID, childID)
	if err != nil {
		release()
		return protocol.RunStartReply{}, err
	}
	dctx, cancel := reserve(ctx)
	_, err = c.dispatch(dctx, a.desc.Name, protocol.OpProviderStart, runID, func(deadline int64) any {
		start.Deadline = deadline
		return start
	}, &protocol.ProviderStartReply{})
	cancel()
	unread := false
	if err != nil && (errors.Is(err, protocol.ErrNotPending) || c.failRun(ctx, start.Run, runRev, err)) {
		// An instance claimed the run (one whose answer we did not wait
		// for): it started the child, or settled it never started.
		unread, err = c.claimedRun(ctx, start.Run, runRev, err)
	}
	if err != nil {
		if !unread { // a run claimed and maybe live keeps its slot until it ends
			release()
		}
		return protocol.RunStartReply{}, err
	}
	c.cfg.Metrics.StartAnswered(start.Run.Provider, start.Run.Mode, time.Since(began))
	return protocol.RunStartReply{RunID: runID, ChildID: childID}, nil
}

// admitRun runs admit's checks for a runs.start, reporting rather than
// refusing a parent at its live-children limit when the coordinator queues
// such starts (full: the start waits in the queue, startqueue.go).
func (c *Coordinator) admitRun(ctx context.Context, r protocol.RunStartRequest) (a admission, full bool, err error) {
	if !c.queueOn() {
		a, err = c.admit(ctx, r.Provider, r.Parent, r.Prompt, r.Options)
		return a, false, err
	}
	desc, err := c.lookupProvider(r.Provider)
	if err != nil {
		return a, false, err
	}
	if err := checkCapabilities(desc, r.Options); err != nil {
		return a, false, err
	}
	l, err := c.authorize(ctx, r.Parent)
	if err != nil {
		return a, false, err
	}
	_, full = c.atLiveLimit(ctx, r.Parent.SessionID)
	a, err = c.admitResolved(ctx, desc, l, r.Parent.SessionID, r.Prompt, r.Options)
	return a, full, err
}

// checkNotify checks a start's notify subject (validNotify): a caller's
// notices go to its own inbox prefix only, never another user's
// (docs/security.md): the deployment lets each user subscribe only under
// _INBOX.<user>.
func (c *Coordinator) checkNotify(req rpc.Request, notify string) error {
	if notify == "" {
		return nil
	}
	if !c.validNotify(notify) {
		return protocol.Errorf(protocol.CodeInvalidArgument,
			"notify must be a literal subject of printable ASCII without wildcards, outside %s.> and $-subjects (use your connection's inbox prefix)", c.subj.Prefix())
	}
	if user := c.callerOf(req); user != "" && !strings.HasPrefix(notify, protocol.UserInboxPrefix(user)+".") {
		return protocol.Errorf(protocol.CodeInvalidArgument,
			"notify %q must lie under your own inbox prefix %s. (connect as NATS user %s with that inbox prefix, as brood does)", notify, protocol.UserInboxPrefix(user), user)
	}
	return nil
}

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
	// autoApprove and approveTools are the child's header autoApprove and
	// approveTools (protocol.ResolveApproval).
	autoApprove, approveTools []string
	choice                    protocol.ChildChoice // model and turn limits (protocol.ResolveChildChoice)
	// requestTimeoutMs is the child's header requestTimeoutMs
	// (protocol.ResolveRequestTimeout).
	requestTimeoutMs int64
	// budget is the budget the start names (validated, within what remains
	// of its parent's: checkChildBudget), nil when it names none.
	budget *protocol.Budget
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
	desc, ok := c.reg.Provider(name)
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
	if n, full := c.atLiveLimit(ctx, parent.SessionID); full {
		return a, liveLimitError(parent.SessionID, n, c.cfg.LiveChildrenMax)
	}
	return c.admitResolved(ctx, desc, l, parent.SessionID, prompt, o)
}

// atLiveLimit reports whether parent's live children (this replica's cache,
// those found ended read fresh) reach LiveChildrenMax, and how many they
// are: a first, cheap look (the slot record decides, slots.go).
func (c *Coordinator) atLiveLimit(ctx context.Context, parent string) (int, bool) {
	live := c.liveChildIDs(parent)
	if len(live) < c.cfg.LiveChildrenMax {
		return len(live), false
	}
	n := len(live) - len(c.endedChildren(ctx, nil, live))
	return n, n >= c.cfg.LiveChildrenMax
}

// liveLimitError is the refusal of a start whose parent has n live
// children, at or above limit.
func liveLimitError(parent string, n, limit int) error {
	return protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
		"limit": "live children per parent", "reason": fmt.Sprintf("session %s already has %d live children; the limit is %d", parent, n, limit)})
}

// admitResolved runs the checks after the parent's authority (l, its lease,
// of session parentID): a queued start (startqueue.go) runs them again at
// its admission, against the lease its credential's hash matches.
func (c *Coordinator) admitResolved(ctx context.Context, desc protocol.ProviderDescriptor, l leaseState, parentID string, prompt []protocol.ContentBlock, o protocol.StartOptions) (admission, error) {
	var a admission
	var err error
	a.desc, a.parent = desc, l
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
	a.pheader, err = c.headers.get(ctx, c.st, parentID)
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
	if a.autoApprove, a.approveTools, err = protocol.ResolveApproval(a.pheader, o.AutoApprove, o.ApproveTools, desc); err != nil {
		return a, err
	}
	if a.requestTimeoutMs, err = protocol.ResolveRequestTimeout(a.pheader, o.RequestTimeoutMs); err != nil {
		return a, err
	}
	if o.Persona != nil {
		if err := protocol.ValidatePersona(*o.Persona); err != nil {
			return a, err
		}
		a.options.Persona = o.Persona
	}
	if a.choice, err = protocol.ResolveChildChoice(desc, a.pheader, o.Model, o.Limits); err != nil {
		return a, err
	}
	if len(o.Label) > protocol.LabelBytesMax {
		return a, protocol.Errorf(protocol.CodeInvalidArgument, "label is longer than %d bytes", protocol.LabelBytesMax)
	}
	a.options.Label = o.Label
	a.budget = o.Budget
	return a, c.checkChildBudget(ctx, a.pheader, o.Budget)
}

// reserveAuthorized takes the live-children slot of childID under the
// session parentID (parent's, its header's id), whose credential is read from the bucket's leader before anything but
// the slot is written: this replica's cache, or a follower, may still hold
// the lease of a root closed a moment ago (chaos seed 3: a run started with
// a closed root's credential 0.4 s after the close, right after a partition
// healed, and its prompt reached the child's log: I4). The read and the
// slot's compare-and-set do not depend on each other, so they run together
// (issue 16: each may wait out an election of brood_agents, and back to
// back they cost a start two); a parent found not live gives the slot back,
// and its refusal is the answer.
func (c *Coordinator) reserveAuthorized(ctx context.Context, parent protocol.ParentRef, parentID, childID string) error {
	var authErr, slotErr error
	_ = parallel(ctx,
		func() error { _, authErr = c.authorizeFresh(ctx, parent); return authErr },
		func() error { slotErr = c.reserveChild(ctx, parentID, childID, ""); return slotErr },
	)
	switch {
	case authErr != nil:
		if slotErr == nil {
			c.releaseChild(ctx, parentID, childID)
		}
		return authErr
	case slotErr != nil:
		return slotErr
	}
	return nil
}

// createRun writes an admitted one-shot run's child header and run record
// and returns the provider start that publishes it, with the record's
// revision. The run and its child are created at the admission, once the
// slot is taken: a child whose settlement let this one in (read while the
// slot was being taken, which may wait for the parent's slot lock and read
// every counted child from the leader) settled before this time, so the
// records never show it live at this child's admission (RELIABILITY.md I8;
// chaos seeds 2 and 3 of issue 9, stamped 28 ms and 1.07 s before the
// slot). The ids are drawn before, as the slot names the child: their ULID
// time is not the admission.
func (c *Coordinator) createRun(ctx context.Context, a admission, req rpc.Request, r protocol.RunStartRequest, runID, childID string) (protocol.ProviderStartRequest, uint64, error) {
	now := store.NowMs()
	header := c.childHeader(a, childID, now)
	if a.budget != nil && len(a.pheader.Budgets) == 0 {
		// Its own budget is the only one it draws on: its first model
		// request's reservation is taken in the ledger's creation.
		header.BudgetStartTokens = protocol.BudgetStartGrant(*a.budget, int64(len(protocol.AllText(r.Prompt))))
	}
	if a.desc.InheritsParentContext {
		seed, err := c.prepare(ctx, a.desc.Name, a.pheader, childID)
		if err != nil {
			return protocol.ProviderStartRequest{}, 0, err
		}
		header.SeedLength = seed
	}
	rec := protocol.RunRecord{
		RunID: runID, ChildID: childID, ParentSession: a.pheader.ID, Provider: a.desc.Name,
		Mode: protocol.ModeOneShot, Notify: r.Notify, NotifyJSON: req.Encoding == protocol.JSON, Structured: a.options.OutputSchema != "", Remote: a.desc.Remote,
		State: protocol.RunRunning, CreatedAt: now,
	}
	var runRev uint64
	if err := parallel(ctx,
		func() error { return c.st.PutHeader(ctx, header) },
		func() (err error) { runRev, err = c.st.CreateRun(ctx, rec); return err },
		func() error { return c.createOwnBudget(ctx, a, header, runID) },
	); err != nil {
		return protocol.ProviderStartRequest{}, 0, protocol.Errorf(protocol.CodeUnavailable, "record the run: %w", err)
	}
	c.cfg.Metrics.RunStarted(rec.Provider, rec.Mode)
	c.st.PutChildIndexAsync(header.ParentSession, protocol.ChildIndexRecord{
		ChildID: childID, CreatedAt: now, Mode: protocol.ModeOneShot, Provider: a.desc.Name,
	}, func(err error) { c.log.Warn("child index entry not written", "child", childID, "err", err) })
	c.headers.add(header)
	return protocol.ProviderStartRequest{
		RunID: runID, Header: header, Provider: a.desc.Name, Prompt: r.Prompt, Notify: r.Notify, NotifyJSON: req.Encoding == protocol.JSON,
		Source: ptrTo(protocol.PromptSource(a.pheader)), RunRevision: protocol.Seq(runRev), Run: rec, Options: a.options, Ancestry: ancestry(a),
	}, runRev, nil
}

func (c *Coordinator) childHeader(a admission, id string, now int64) protocol.SessionHeader {
	budgets, deadline := childBudgets(a.pheader, a.budget, id, now)
	return protocol.SessionHeader{
		Budgets: budgets, BudgetDeadlineAt: deadline,
		Version: protocol.SessionHeaderVersion, ID: id, CreatedAt: now, Cwd: a.pheader.Cwd,
		ParentSession: a.pheader.ID, Origin: protocol.OriginSubagent, DelegationDepth: a.depth,
		ToolCeiling: a.ceiling, DepthCap: a.depthCap, Provider: a.desc.Name,
		Model: a.choice.Model, Limits: a.choice.Limits,
		// The tree's user, for the worker's per-user workspace fence
		// (docs/security.md, "The workspace is fenced").
		User:             a.pheader.User,
		AutoApprove:      a.autoApprove,
		ApproveTools:     a.approveTools,
		RequestTimeoutMs: a.requestTimeoutMs,
	}
}

func ptrTo[T any](v T) *T { return &v }

func ancestry(a admission) []string {
	return append(append([]string(nil), a.parent.rec.Ancestry...), a.pheader.ID)
}
