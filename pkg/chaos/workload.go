package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// WorkloadConfig shapes the seeded workload.
type WorkloadConfig struct {
	// Seed drives every choice; the same seed makes the same choices (the
	// timing of their answers differs from run to run).
	Seed int64
	// Clients is the number of concurrent clients, each with its own
	// endpoint, connection, roots and user grant (4).
	Clients int
	// Provider is the provider of every child ("spawn").
	Provider string
	// LiveChildrenMax is the coordinators' limit; a limit burst starts
	// this many plus three continuable children of one root at once.
	LiveChildrenMax int
	// OpTimeout bounds each call (20 s); retries of a followup with its
	// idempotency key stay within RetryBudget (30 s).
	OpTimeout   time.Duration
	RetryBudget time.Duration
	// RunResultTimeout bounds the wait for a one-shot run's result (2 min).
	RunResultTimeout time.Duration
	// Think is the most a client waits between operations (150 ms).
	Think time.Duration
	// ContinuableBudgets: one continuable start in two names a budget
	// too, as one-shot runs do (make chaos); off, continuable starts name
	// none. The short seed leaves it off: a capped continuable child's
	// model request can wait agent.BudgetWaitMax (10 s a step) for
	// tokens other sessions' reservations in flight hold, which can stall
	// its queue past L1's bound (RELIABILITY.md).
	ContinuableBudgets bool
	// Cwd is the workspace of every root (an existing absolute directory).
	Cwd  string
	Logf func(format string, args ...any)
}

func (cfg *WorkloadConfig) defaults() {
	if cfg.Clients <= 0 {
		cfg.Clients = 4
	}
	if cfg.Provider == "" {
		cfg.Provider = "spawn"
	}
	if cfg.LiveChildrenMax <= 0 {
		cfg.LiveChildrenMax = 64
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 20 * time.Second
	}
	if cfg.RetryBudget <= 0 {
		cfg.RetryBudget = 30 * time.Second
	}
	if cfg.RunResultTimeout <= 0 {
		cfg.RunResultTimeout = 2 * time.Minute
	}
	if cfg.Think <= 0 {
		cfg.Think = 150 * time.Millisecond
	}
	if cfg.Cwd == "" {
		cfg.Cwd = os.TempDir()
	}
}

// Workload drives Brood with seeded client operations, recording each.
type Workload struct {
	cfg     WorkloadConfig
	rec     *Recorder
	clients []*wclient

	mu    sync.Mutex
	roots []*wroot // every root ever opened, for foreign requests
	// budgets are the budgets the workload's starts named, by child
	// session id (a raise raises only the limits its ledger names).
	budgets map[string]protocol.Budget
	// raises counts the raises of each ledger (raisesPerLedgerMax);
	// capped holds the children whose own ledger reached it: the clients
	// send them no more followups (each would be a turn paused, then
	// denied), only the last message.
	raises map[string]int
	capped map[string]bool
}

type wclient struct {
	w    *Workload
	name string
	idx  int
	rng  *rand.Rand
	ep   *Endpoint
	nc   *nats.Conn
	cl   *client.Client

	notifyPrefix string
	runs         sync.WaitGroup
	seq          int   // the loop's own
	drains       []*Op // drains not lifted yet (the loop's own, then Finish's)

	// mu guards what the loop shares with the followup senders, the run
	// waiters and the other clients.
	mu      sync.Mutex
	waiters map[string]chan protocol.RunNotice // by notify token
	tokens  map[string]*Op
	grant   string
	roots   []*wroot
	orphans []*wchild // continuable children of closed roots
}

type wroot struct {
	c      *wclient
	root   *client.Root
	id     string
	ref    protocol.ParentRef
	closed atomic.Bool
	// gone: its close completed, or its credential was refused: from then
	// on every request with it must be refused (I4). closed is set as its
	// close begins, so a request of another client may run concurrently
	// with the close and be admitted before it.
	gone     atomic.Bool
	children []*wchild      // guarded by c.mu
	inflight map[string]*Op // one-shot runs not settled yet, by run id; guarded by c.mu
}

type wchild struct {
	id   string
	root *wroot
}

// NewWorkload connects the workload's clients through endpoints of c.
func NewWorkload(c *Cluster, rec *Recorder, cfg WorkloadConfig) (*Workload, error) {
	cfg.defaults()
	w := &Workload{cfg: cfg, rec: rec, budgets: map[string]protocol.Budget{}, raises: map[string]int{}, capped: map[string]bool{}}
	for i := 0; i < cfg.Clients; i++ {
		name := fmt.Sprintf("client-%d", i+1)
		ep, err := c.NewEndpoint(name)
		if err != nil {
			w.Close()
			return nil, err
		}
		nc, err := nats.Connect(ep.URLs(i), nats.Name("chaos-"+name), nats.MaxReconnects(-1),
			nats.ReconnectWait(100*time.Millisecond), nats.Timeout(5*time.Second), nats.PingInterval(2*time.Second))
		if err != nil {
			w.Close()
			return nil, err
		}
		cl, err := client.New(nc, client.Options{Timeout: cfg.OpTimeout, AwaitFallback: 10 * time.Second})
		if err != nil {
			nc.Close()
			w.Close()
			return nil, err
		}
		wc := &wclient{
			w: w, name: name, idx: i, rng: rand.New(rand.NewSource(cfg.Seed*1000 + int64(i))),
			ep: ep, nc: nc, cl: cl, waiters: map[string]chan protocol.RunNotice{}, tokens: map[string]*Op{},
		}
		wc.notifyPrefix = nc.NewRespInbox() + ".notify"
		if _, err := nc.Subscribe(wc.notifyPrefix+".*", wc.onNotice); err != nil {
			w.Close()
			return nil, err
		}
		w.clients = append(w.clients, wc)
	}
	return w, nil
}

// Endpoints are the workload clients' endpoints (for client-cut faults).
func (w *Workload) Endpoints() []*Endpoint {
	var out []*Endpoint
	for _, c := range w.clients {
		out = append(out, c.ep)
	}
	return out
}

// Close closes the clients' connections.
func (w *Workload) Close() {
	for _, c := range w.clients {
		c.runs.Wait()
		c.cl.Close()
		c.nc.Close()
	}
}

func (w *Workload) logf(format string, args ...any) {
	if w.cfg.Logf != nil {
		w.cfg.Logf(format, args...)
	}
}

// Run drives every client until ctx ends.
func (w *Workload) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.answerBudgetPauses(ctx)
	}()
	for _, c := range w.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.loop(ctx)
		}()
	}
	wg.Wait()
}

// Finish runs once the faults healed: every drain is lifted, every
// continuable child gets one last message (it unparks an interrupted queue),
// and every run's result is awaited. The caller answers the pending
// requests meanwhile and until the stores are quiet (AnswerPending).
func (w *Workload) Finish(ctx context.Context) {
	var wg sync.WaitGroup
	for _, c := range w.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.finish(ctx)
		}()
	}
	wg.Wait()
	for _, c := range w.clients {
		c.runs.Wait()
	}
}

// AnswerPending answers every pending request (answerPending) until stop
// is called; stop returns once the last answer completed, with when the
// last answer or raise sent completed (Unix ms, 0: none). The run keeps it
// going through Finish and the wait for quiet: a continuable child at its
// budget's cap pauses each turn its last messages open, and left
// unanswered each pause would last the request timeout, one after the
// other, past L1's bound.
func (w *Workload) AnswerPending(ctx context.Context) (stop func() int64) {
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var last atomic.Int64
	go func() {
		defer close(done)
		w.answerPending(sctx, &last)
	}()
	return func() int64 {
		cancel()
		<-done
		return last.Load()
	}
}

// Roots returns the ids of every root the workload opened.
func (w *Workload) Roots() map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]bool{}
	for _, r := range w.roots {
		out[r.id] = true
	}
	return out
}

// CloseRoots closes every root still open (at the very end).
func (w *Workload) CloseRoots(ctx context.Context) {
	w.mu.Lock()
	roots := append([]*wroot(nil), w.roots...)
	w.mu.Unlock()
	for _, r := range roots {
		if r.closed.CompareAndSwap(false, true) {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_ = r.root.Close(cctx)
			cancel()
		}
	}
}

// --- the client loop -------------------------------------------------------

// action is one weighted choice of the loop.
type action struct {
	name   string
	weight int
	run    func(ctx context.Context)
}

func (c *wclient) loop(ctx context.Context) {
	c.mintGrant(ctx)
	actions := []action{
		{"run", 22, c.oneShot},
		{"start", 10, c.startChild},
		{"followups", 30, c.followupBurst},
		{"interrupt", 4, c.interrupt},
		{"dispose", 4, c.dispose},
		{"cascade", 3, c.cascade},
		{"drain", 3, c.drainAndLift},
		{"foreign", 6, c.foreign},
		{"limit-burst", 1, c.limitBurst},
		{"answer", 16, c.answerRequests},
	}
	total := 0
	for _, a := range actions {
		total += a.weight
	}
	for ctx.Err() == nil {
		if c.userGrant() == "" {
			c.mintGrant(ctx)
		}
		if len(c.liveRoots()) < 2 {
			c.openRoot(ctx)
			continue
		}
		n := c.rng.Intn(total)
		for _, a := range actions {
			if n < a.weight {
				a.run(ctx)
				break
			}
			n -= a.weight
		}
		c.think(ctx)
	}
}

func (c *wclient) think(ctx context.Context) {
	d := time.Duration(c.rng.Int63n(int64(c.w.cfg.Think) + 1))
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// call runs one coordinator call with the op's deadline (detached from the
// loop's ctx: an op once invoked completes or times out on its own).
func (c *wclient) call(endpoint string, req, reply any) error {
	return c.callWithin(c.w.cfg.OpTimeout, endpoint, req, reply)
}

// callWithin is call with the deadline timeout.
func (c *wclient) callWithin(timeout time.Duration, endpoint string, req, reply any) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := c.cl.Call(ctx, endpoint, req, reply)
	if err != nil && ctx.Err() != nil && protocol.CodeOf(err) == "" {
		return fmt.Errorf("%w: %v", errTimeout, err)
	}
	return err
}

func (c *wclient) invoke(op *Op) *Op {
	op.Client = c.name
	return c.w.rec.Invoke(op)
}

func (c *wclient) liveRoots() []*wroot {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*wroot
	for _, r := range c.roots {
		if !r.closed.Load() {
			out = append(out, r)
		}
	}
	return out
}

func (c *wclient) userGrant() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.grant
}

func (c *wclient) pickRoot() *wroot {
	rs := c.liveRoots()
	if len(rs) == 0 {
		return nil
	}
	return rs[c.rng.Intn(len(rs))]
}

// mintGrant asks for this client's user grant (a second sender of followups).
func (c *wclient) mintGrant(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	op := c.invoke(&Op{Kind: OpGrant})
	var r protocol.UserGrantReply
	err := c.call(protocol.EpAuthorityUser, protocol.Empty{}, &r)
	c.w.rec.Complete(op, err)
	if err == nil {
		c.mu.Lock()
		c.grant = r.Grant
		c.mu.Unlock()
	}
}

func (c *wclient) openRoot(ctx context.Context) {
	op := c.invoke(&Op{Kind: OpOpenRoot})
	octx, cancel := context.WithTimeout(context.Background(), c.w.cfg.OpTimeout)
	root, err := c.cl.OpenRoot(octx, protocol.AgentsOpenRequest{Cwd: c.w.cfg.Cwd})
	cancel()
	if err != nil && octx.Err() != nil && protocol.CodeOf(err) == "" {
		err = fmt.Errorf("%w: %v", errTimeout, err)
	}
	if err == nil {
		c.w.rec.Update(op, func(o *Op) { o.Root, o.Sender = root.SessionID, root.SessionID })
	}
	c.w.rec.Complete(op, err)
	if err != nil {
		c.think(ctx)
		return
	}
	r := &wroot{c: c, root: root, id: root.SessionID, ref: root.Ref(), inflight: map[string]*Op{}}
	c.mu.Lock()
	c.roots = append(c.roots, r)
	c.mu.Unlock()
	c.w.mu.Lock()
	c.w.roots = append(c.w.roots, r)
	c.w.mu.Unlock()
}

// rootGone notes a root whose credential was refused (its lease lapsed
// while its client was cut off): it is replaced.
func (c *wclient) rootGone(r *wroot, err error) {
	if protocol.CodeOf(err) != protocol.CodeUnauthorized {
		return
	}
	r.gone.Store(true)
	if !r.closed.CompareAndSwap(false, true) {
		return
	}
	c.w.logf("%s: root %s no longer live: %v", c.name, r.id, err)
	c.mu.Lock()
	c.orphans = append(c.orphans, r.children...)
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = r.root.Close(ctx) // stops the renewals; the root is already gone
	cancel()
}

// --- one-shot runs ---------------------------------------------------------

// script returns a one-shot prompt of op opID: a plain answer, a sleep, a
// nested chain (deeper than the subagent tool's cap of 3 sometimes, which
// it must refuse), a fan-out, a background (continuable) grandchild, or
// (one in eight) a call that parks on a request (askingRunScript).
func (c *wclient) script(opID int64, marker string) string {
	say := "say " + marker
	if c.rng.Intn(8) == 0 {
		return c.askingRunScript(opID, marker)
	}
	switch n := c.rng.Intn(10); {
	case n < 3:
		return say
	case n < 5:
		return fmt.Sprintf("sleep %dms\n%s", 50+c.rng.Intn(600), say)
	case n < 7:
		return nested(1+c.rng.Intn(4)) + "\n" + say
	case n < 9:
		k := 2 + c.rng.Intn(2)
		var lines []string
		for i := 0; i < k; i++ {
			lines = append(lines, subagentCall(fmt.Sprintf("sleep %dms\nsay leaf-%d", c.rng.Intn(300), i), false))
		}
		return strings.Join(lines, "\n") + "\n" + say
	default:
		return subagentCall(fmt.Sprintf("sleep %dms\nsay bg", c.rng.Intn(400)), true) + "\n" + say
	}
}

// budget is the budget of a start, a one-shot run's or (with
// ContinuableBudgets) a continuable child's (I11): none one time in two (the child draws on nothing), else
// small limits its subtree often reaches: tokens (the scripted model
// counts one per word in and out), model requests, tool calls, children
// started, and rarely a deadline. A fan-out or nested script under it
// reserves from one ledger on several workers at once. A continuable child
// (or a one-shot run's background grandchild) at its cap pauses its turn
// on a request of kind budget (docs/protocol.md §5.5, "Pause and raise"),
// which the workload answers soon (answerBudgetPauses, and the loops'
// answers): a raise of its ledger, or a denial, so no followup waits out
// the request timeout (8 s) behind a pause.
func (c *wclient) budget() *protocol.Budget {
	if c.rng.Intn(2) != 0 {
		return nil
	}
	var b protocol.Budget
	if c.rng.Intn(2) == 0 {
		b.Tokens = 20 + int64(c.rng.Intn(300))
	}
	if c.rng.Intn(2) == 0 {
		b.ModelRequests = 1 + int64(c.rng.Intn(5))
	}
	if c.rng.Intn(3) == 0 {
		b.ToolCalls = 1 + int64(c.rng.Intn(3))
	}
	if c.rng.Intn(3) == 0 {
		b.Children = 1 + int64(c.rng.Intn(3))
	}
	if c.rng.Intn(8) == 0 {
		b.DeadlineMs = 500 + int64(c.rng.Intn(3000))
	}
	if b.IsZero() {
		b.Tokens = 20 + int64(c.rng.Intn(300))
	}
	return &b
}

// subagentCall is a scripted `call subagent` line.
func subagentCall(prompt string, background bool) string {
	args := map[string]any{"description": "chaos", "prompt": prompt}
	if background {
		args["run_in_background"] = true
	}
	b, _ := json.Marshal(args)
	return "call subagent " + string(b)
}

// nested is a chain of depth (≥ 1) levels of one-shot delegation below the
// child: one call line, whose answer the caller's next lines follow.
func nested(depth int) string {
	s := "say leaf"
	for i := 1; i < depth; i++ {
		s = subagentCall(s, false) + "\nsay up"
	}
	return subagentCall(s, false)
}

func (c *wclient) oneShot(ctx context.Context) {
	r := c.pickRoot()
	if r == nil {
		return
	}
	c.startRun(r, "")
}

// startRun starts a one-shot run of root r (script "" picks one) and
// awaits its result in the background.
func (c *wclient) startRun(r *wroot, script string) *Op {
	op := c.invoke(&Op{Kind: OpRun, Root: r.id, Parent: r.id, Sender: r.id})
	marker := Marker(op.ID)
	if script == "" {
		script = c.script(op.ID, marker)
	} else {
		script += "\nsay " + marker
	}
	token := nuid.Next()
	ch := make(chan protocol.RunNotice, 4)
	c.mu.Lock()
	c.waiters[token], c.tokens[token] = ch, op
	c.mu.Unlock()
	budget := c.budget()
	c.w.rec.Update(op, func(o *Op) { o.Marker, o.Script, o.Budget = marker, script, budget })
	var reply protocol.RunStartReply
	err := c.call(protocol.EpRunsStart, protocol.RunStartRequest{
		Provider: c.w.cfg.Provider, Parent: r.ref, Prompt: protocol.Text(script), Notify: c.notifyPrefix + "." + token,
		Options: protocol.StartOptions{Budget: budget},
	}, &reply)
	if err == nil {
		c.w.rec.Update(op, func(o *Op) { o.RunID, o.Child = reply.RunID, reply.ChildID })
		c.w.noteBudget(reply.ChildID, budget)
	}
	c.w.rec.Complete(op, err)
	if err != nil {
		c.rootGone(r, err)
		return op
	}
	c.mu.Lock()
	r.inflight[reply.RunID] = op
	c.mu.Unlock()
	c.runs.Add(1)
	go func() {
		defer c.runs.Done()
		c.awaitRun(r, op, reply, ch)
	}()
	return op
}

func (c *wclient) onNotice(m *nats.Msg) {
	token := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	var n protocol.RunNotice
	if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &n); err != nil {
		return
	}
	c.mu.Lock()
	op, ch := c.tokens[token], c.waiters[token]
	c.mu.Unlock()
	if op == nil {
		return
	}
	c.w.rec.Update(op, func(o *Op) {
		o.Notices = append(o.Notices, Notice{At: time.Now().UnixMilli(), StopReason: string(n.Result.StopReason), ErrorCode: string(n.Result.ErrorCode)})
	})
	select {
	case ch <- n:
	default:
	}
}

// awaitRun waits for the run's notice, asking runs.await when none came.
// The notify token stays registered so a second notice is still recorded.
func (c *wclient) awaitRun(r *wroot, op *Op, reply protocol.RunStartReply, ch chan protocol.RunNotice) {
	deadline := time.Now().Add(c.w.cfg.RunResultTimeout)
	done := func(res protocol.SubagentResult) {
		c.w.rec.Update(op, func(o *Op) {
			o.ResultAt, o.StopReason, o.ResultCode = time.Now().UnixMilli(), string(res.StopReason), string(res.ErrorCode)
		})
		c.mu.Lock()
		delete(r.inflight, reply.RunID)
		c.mu.Unlock()
	}
	for time.Now().Before(deadline) {
		select {
		case n := <-ch:
			done(n.Result)
			return
		case <-time.After(10 * time.Second):
		}
		var st protocol.RunStatus
		err := c.call(protocol.EpRunsAwait, protocol.RunRef{RunID: reply.RunID, Parent: &r.ref, WaitMs: 1000}, &st)
		if err == nil && st.State == protocol.RunSettled && st.Result != nil {
			done(*st.Result)
			return
		}
		if protocol.CodeOf(err) == protocol.CodeUnauthorized {
			return // the root is gone: its runs are disposed, nobody awaits them
		}
	}
}

func (c *wclient) dispose(ctx context.Context) {
	r := c.pickRoot()
	if r == nil {
		return
	}
	// A run that is still running: start a long one when there is none.
	runID, child := c.inflightRun(r)
	if runID == "" {
		op := c.startRun(r, fmt.Sprintf("sleep %dms", 1500+c.rng.Intn(2500)))
		if runID, child = c.inflightRun(r); runID == "" || runID != op.RunID {
			return
		}
		c.think(ctx)
	}
	op := c.invoke(&Op{Kind: OpDispose, Root: r.id, Parent: r.id, Sender: r.id, RunID: runID, Child: child})
	var st protocol.RunStatus
	err := c.call(protocol.EpRunsDispose, protocol.RunRef{RunID: runID, Parent: &r.ref}, &st)
	c.w.rec.Complete(op, err)
	c.rootGone(r, err)
}

// inflightRun returns a run of r that has no result yet, if any.
func (c *wclient) inflightRun(r *wroot) (runID, child string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, op := range r.inflight {
		return id, op.Child
	}
	return "", ""
}

// --- continuable children --------------------------------------------------

func (c *wclient) childID() string {
	c.seq++
	return fmt.Sprintf("c%d-%d-%d", c.w.cfg.Seed, c.idx+1, c.seq)
}

// startScript is a continuable child's first prompt (of op opID): an
// answer after a short sleep, a background grandchild it owns until that
// one settles, or (one in six) a call that parks on a request
// (askingStartScript).
func (c *wclient) startScript(opID int64, marker string) string {
	if c.rng.Intn(6) == 0 {
		return c.askingStartScript(opID, marker)
	}
	if c.rng.Intn(5) == 0 {
		return subagentCall(fmt.Sprintf("sleep %dms\nsay grandchild", c.rng.Intn(500)), true) + "\nsay " + marker
	}
	return fmt.Sprintf("sleep %dms\nsay %s", c.rng.Intn(600), marker)
}

// ChildrenPerRootMax is how many continuable children the workload gives
// one root before it starts on another (a new one, once a client has
// rootsMax roots: the fullest is closed, a cascade): resumed children are
// live too, and a root at the live-children limit has every start refused.
const ChildrenPerRootMax = 5

// rootsMax is how many roots a client keeps open.
const rootsMax = 3

func (c *wclient) startChild(ctx context.Context) {
	var room, fullest *wroot
	most := -1
	for _, r := range c.liveRoots() {
		c.mu.Lock()
		n := len(r.children)
		c.mu.Unlock()
		if n < ChildrenPerRootMax && (room == nil || c.rng.Intn(2) == 0) {
			room = r
		}
		if n > most {
			fullest, most = r, n
		}
	}
	if room == nil {
		if len(c.liveRoots()) >= rootsMax && fullest != nil {
			c.closeRoot(fullest)
		}
		c.openRoot(ctx)
		return
	}
	c.startOn(room, "")
}

// startOn starts a continuable child of r with a chosen id, retrying an
// unknown outcome once (DUPLICATE_CHILD then means the first one landed).
func (c *wclient) startOn(r *wroot, script string) *Op {
	id := c.childID()
	op := c.invoke(&Op{Kind: OpStart, Root: r.id, Parent: r.id, Sender: r.id, Child: id})
	marker := Marker(op.ID)
	if script == "" {
		script = c.startScript(op.ID, marker)
	} else {
		script += "\nsay " + marker
	}
	var budget *protocol.Budget
	if c.w.cfg.ContinuableBudgets {
		budget = c.budget()
	}
	c.w.rec.Update(op, func(o *Op) { o.Marker, o.Script, o.Budget = marker, script, budget })
	var reply protocol.ContinuableStartReply
	err := queuedStart(reply, c.call(protocol.EpContinuableStart, protocol.ContinuableStartRequest{
		Provider: c.w.cfg.Provider, Parent: r.ref, Label: "chaos", ChildID: id, Prompt: protocol.Text(script),
		Options: protocol.ContinuableOptions{Budget: budget},
	}, &reply))
	if err == nil {
		c.w.rec.Update(op, func(o *Op) { o.MessageID = reply.MessageID })
	}
	c.w.rec.Complete(op, err)
	c.rootGone(r, err)
	if outcome, _, _ := Classify(err); outcome != OutcomeFail {
		c.addChild(r, id)
		c.w.noteBudget(id, budget)
	}
	return op
}

// queuedStart is the error a continuable start answered queued is recorded
// with (err when it was not): its child starts only if its parent is still
// live when a slot frees (docs/protocol.md §5.5, "The start queue"), so
// whether its message lands is unknown when the call returns, as for a
// start whose answer was lost; its message, if it lands, is checked as
// accepted once.
func queuedStart(reply protocol.ContinuableStartReply, err error) error {
	if err == nil && reply.State == protocol.StateQueued {
		return fmt.Errorf("chaos: the start of %s waits in its parent's start queue (message %s once it starts)", reply.ChildID, reply.MessageID)
	}
	return err
}

// forget drops a child that does not exist (an unknown start that did not land).
func (c *wclient) forget(ch *wchild) {
	c.mu.Lock()
	defer c.mu.Unlock()
	drop := func(list []*wchild) []*wchild {
		out := list[:0]
		for _, x := range list {
			if x != ch {
				out = append(out, x)
			}
		}
		return out
	}
	ch.root.children = drop(ch.root.children)
	c.orphans = drop(c.orphans)
}

func (c *wclient) addChild(r *wroot, id string) {
	c.mu.Lock()
	r.children = append(r.children, &wchild{id: id, root: r})
	c.mu.Unlock()
}

// allChildren returns every continuable child this client started.
func (c *wclient) allChildren() []*wchild {
	c.mu.Lock()
	defer c.mu.Unlock()
	var all []*wchild
	for _, r := range c.roots {
		all = append(all, r.children...)
	}
	return append(all, c.orphans...)
}

func (c *wclient) pickChild() *wchild {
	all := c.w.uncapped(c.allChildren())
	if len(all) == 0 {
		return nil
	}
	// Prefer recent children: they are more often running.
	if c.rng.Intn(2) == 0 && len(all) > 4 {
		all = all[len(all)-4:]
	}
	return all[c.rng.Intn(len(all))]
}

// sender is one authority that may message a child.
type sender struct {
	name string
	auth protocol.Authority
}

func (c *wclient) sendersFor(ch *wchild) []sender {
	var out []sender
	if !ch.root.closed.Load() {
		ref := ch.root.ref
		out = append(out, sender{ch.root.id, protocol.Authority{Parent: &ref}})
	}
	if g := c.userGrant(); g != "" {
		out = append(out, sender{"grant:" + c.name, protocol.Authority{Grant: g}})
	}
	// Another client's grant: a third sender of the same user.
	other := c.w.clients[(c.idx+1)%len(c.w.clients)]
	if g := other.userGrant(); other != c && g != "" {
		out = append(out, sender{"grant:" + other.name, protocol.Authority{Grant: g}})
	}
	return out
}

// followupBurst sends 2–6 followups to one child from one to three senders
// at once; each sender sends its own in order, one at a time.
func (c *wclient) followupBurst(ctx context.Context) {
	ch := c.pickChild()
	if ch == nil {
		c.startChild(ctx)
		return
	}
	senders := c.sendersFor(ch)
	if len(senders) == 0 {
		return
	}
	k := 1 + c.rng.Intn(len(senders))
	c.rng.Shuffle(len(senders), func(i, j int) { senders[i], senders[j] = senders[j], senders[i] })
	senders = senders[:k]
	type plan struct {
		s      sender
		n      int
		keyed  []bool
		sleeps []int
	}
	var plans []plan
	for _, s := range senders {
		p := plan{s: s, n: 1 + c.rng.Intn(3)}
		for i := 0; i < p.n; i++ {
			p.keyed = append(p.keyed, c.rng.Intn(4) != 0)
			p.sleeps = append(p.sleeps, c.rng.Intn(4)*50)
		}
		plans = append(plans, p)
	}
	var wg sync.WaitGroup
	for _, p := range plans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < p.n; i++ {
				c.followup(ch, p.s, p.keyed[i], p.sleeps[i])
			}
		}()
	}
	wg.Wait()
}

// followup sends one message; with an idempotency key it retries an
// unknown outcome within the retry budget, so the message is stored once.
func (c *wclient) followup(ch *wchild, s sender, keyed bool, sleepMs int) *Op {
	op := c.invoke(&Op{Kind: OpFollowup, Root: ch.root.id, Parent: ch.root.id, Sender: s.name, Child: ch.id})
	marker := Marker(op.ID)
	script := "say " + marker
	if sleepMs > 0 {
		script = fmt.Sprintf("sleep %dms\n%s", sleepMs, script)
	}
	key := ""
	if keyed {
		key = fmt.Sprintf("k%d", op.ID)
	}
	c.w.rec.Update(op, func(o *Op) { o.Marker, o.Script, o.Key = marker, script, key })
	req := protocol.FollowupRequest{ChildID: ch.id, Authority: s.auth, Message: protocol.Text(script), IdempotencyKey: key}
	deadline := time.Now().Add(c.w.cfg.RetryBudget)
	for attempt := 1; ; attempt++ {
		var reply protocol.FollowupReply
		err := c.call(protocol.EpContinuableFollowup, req, &reply)
		outcome, _, _ := Classify(err)
		if outcome != OutcomeUnknown || key == "" || time.Now().After(deadline) {
			if err == nil {
				c.w.rec.Update(op, func(o *Op) { o.MessageID = reply.MessageID })
			}
			c.w.rec.Update(op, func(o *Op) { o.Attempts = attempt })
			c.w.rec.Complete(op, err)
			if s.auth.Parent != nil {
				c.rootGone(ch.root, err)
			}
			if protocol.CodeOf(err) == protocol.CodeNotResumable {
				c.forget(ch) // its start never landed
			}
			return op
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (c *wclient) interrupt(ctx context.Context) {
	ch := c.pickChild()
	if ch == nil || ch.root.closed.Load() {
		return
	}
	ref := ch.root.ref
	op := c.invoke(&Op{Kind: OpInterrupt, Root: ch.root.id, Parent: ch.root.id, Sender: ch.root.id, Child: ch.id})
	err := c.call(protocol.EpContinuableInterrupt, protocol.InterruptRequest{ChildID: ch.id, Authority: protocol.Authority{Parent: &ref}}, &struct{}{})
	c.w.rec.Complete(op, err)
	c.rootGone(ch.root, err)
}

// cascade closes a root that has descendants (starting some first), the
// cascade cancel of I5, and opens another in its place.
func (c *wclient) cascade(ctx context.Context) {
	r := c.pickRoot()
	if r == nil {
		return
	}
	if id, _ := c.inflightRun(r); id == "" {
		c.startRun(r, nested(2)+"\n"+fmt.Sprintf("sleep %dms", 500+c.rng.Intn(1500)))
	}
	c.mu.Lock()
	noChildren := len(r.children) == 0
	c.mu.Unlock()
	if noChildren {
		c.startOn(r, subagentCall("sleep 800ms\nsay deep", true))
	}
	c.closeRoot(r)
}

// closeRoot closes r (a cascade cancel when it has descendants).
func (c *wclient) closeRoot(r *wroot) {
	if !r.closed.CompareAndSwap(false, true) {
		return
	}
	op := c.invoke(&Op{Kind: OpCloseRoot, Root: r.id, Parent: r.id, Sender: r.id})
	octx, cancel := context.WithTimeout(context.Background(), c.w.cfg.OpTimeout)
	err := r.root.Close(octx)
	cancel()
	c.w.rec.Complete(op, err)
	if err == nil {
		r.gone.Store(true)
	}
	c.mu.Lock()
	c.orphans = append(c.orphans, r.children...)
	c.mu.Unlock()
}

// drainAndLift drains one child's subtree (its activations are disposed;
// nothing stays closed), or one root's descendants or (rarely) everything,
// which stay closed until this client lifts the drain after a while.
func (c *wclient) drainAndLift(ctx context.Context) {
	g := c.userGrant()
	if g == "" {
		return
	}
	grant := protocol.Authority{Grant: g}
	var op *Op
	var req protocol.DrainRequest
	switch n := c.rng.Intn(10); {
	case n < 5:
		ch := c.pickChild()
		if ch == nil || ch.root.closed.Load() {
			return
		}
		ref := ch.root.ref
		req = protocol.DrainRequest{Authority: protocol.Authority{Parent: &ref}, Parent: ch.root.id, Children: []string{ch.id}}
		op = &Op{Kind: OpDrain, Root: ch.root.id, Parent: ch.root.id, Sender: ch.root.id, Scope: "children", Targets: []string{ch.id}}
	case n < 9:
		r := c.pickRoot()
		if r == nil {
			return
		}
		req = protocol.DrainRequest{Authority: grant, Parents: []string{r.id}}
		op = &Op{Kind: OpDrain, Root: r.id, Sender: "grant:" + c.name, Scope: "parent", Targets: []string{r.id}}
	default:
		req = protocol.DrainRequest{Authority: grant}
		op = &Op{Kind: OpDrain, Sender: "grant:" + c.name, Scope: "all"}
	}
	c.invoke(op)
	var reply protocol.DrainReply
	err := c.call(protocol.EpContinuableDrain, req, &reply)
	c.w.rec.Complete(op, err)
	if outcome, _, _ := Classify(err); outcome == OutcomeFail || op.Scope == "children" {
		return
	}
	c.drains = append(c.drains, op)
	select {
	case <-ctx.Done():
		return // Finish lifts it
	case <-time.After(time.Duration(500+c.rng.Intn(2000)) * time.Millisecond):
	}
	c.liftAll(context.Background())
}

// liftAll lifts every drain this client made, retrying each until it is
// lifted or the retry budget ends.
func (c *wclient) liftAll(ctx context.Context) {
	var left []*Op
	for _, d := range c.drains {
		req := protocol.DrainRequest{Authority: protocol.Authority{Grant: c.userGrant()}, Lift: true}
		switch d.Scope {
		case "children":
			req.Parent, req.Children = d.Parent, d.Targets
		case "parent":
			req.Parents = d.Targets
		}
		deadline := time.Now().Add(c.w.cfg.RetryBudget)
		lifted := false
		for !lifted && time.Now().Before(deadline) && ctx.Err() == nil {
			op := c.invoke(&Op{Kind: OpLift, Root: d.Root, Parent: d.Parent, Sender: "grant:" + c.name, Scope: d.Scope, Targets: d.Targets})
			err := c.call(protocol.EpContinuableDrain, req, &protocol.DrainReply{})
			c.w.rec.Complete(op, err)
			lifted = err == nil
			if !lifted {
				time.Sleep(250 * time.Millisecond)
			}
		}
		if !lifted {
			left = append(left, d)
		}
	}
	c.drains = left
}

// limitBurst starts LiveChildrenMax+3 continuable children of one fresh
// root at once: some wait in the root's start queue (or are refused
// LIMIT_EXCEEDED when the coordinators queue nothing), and never more than
// the limit may be live (I8).
func (c *wclient) limitBurst(ctx context.Context) {
	c.openRoot(ctx)
	c.mu.Lock()
	r := c.roots[len(c.roots)-1]
	c.mu.Unlock()
	if r.closed.Load() {
		return
	}
	n := c.w.cfg.LiveChildrenMax + 3
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		id := c.childID()
		op := c.invoke(&Op{Kind: OpStart, Root: r.id, Parent: r.id, Sender: r.id, Child: id})
		// Drawn here, in the seeded order: the rng is the loop's own.
		script := fmt.Sprintf("sleep %dms\nsay %s", 1000+c.rng.Intn(1000), Marker(op.ID))
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.w.rec.Update(op, func(o *Op) { o.Marker, o.Script = Marker(op.ID), script })
			var reply protocol.ContinuableStartReply
			err := c.call(protocol.EpContinuableStart, protocol.ContinuableStartRequest{
				Provider: c.w.cfg.Provider, Parent: r.ref, Label: "burst", ChildID: id, Prompt: protocol.Text(script),
			}, &reply)
			err = queuedStart(reply, err)
			if err == nil {
				c.w.rec.Update(op, func(o *Op) { o.MessageID = reply.MessageID })
			}
			c.w.rec.Complete(op, err)
			if outcome, _, _ := Classify(err); outcome != OutcomeFail {
				c.addChild(r, id)
			}
		}()
	}
	wg.Wait()
}

// --- senders without authority ---------------------------------------------

// foreign sends a request with an authority that does not cover its target:
// another root's credential, a closed root's, a forged one.
func (c *wclient) foreign(ctx context.Context) {
	ch := c.pickChild()
	c.w.mu.Lock()
	all := append([]*wroot(nil), c.w.roots...)
	c.w.mu.Unlock()
	var other, dead *wroot
	for _, i := range c.rng.Perm(len(all)) {
		r := all[i]
		if ch != nil && r == ch.root {
			continue
		}
		if r.gone.Load() && dead == nil {
			dead = r
		}
		if !r.closed.Load() && other == nil {
			other = r
		}
	}
	forged := protocol.ParentRef{SessionID: "", Credential: nuid.Next()}
	switch n := c.rng.Intn(6); {
	case n == 0 && ch != nil && other != nil:
		c.foreignFollowup(ch, "followup-other-root", other.ref)
	case n == 1 && ch != nil && dead != nil:
		c.foreignFollowup(ch, "followup-dead-root", dead.ref)
	case n == 2 && ch != nil:
		forged.SessionID = ch.root.id
		c.foreignFollowup(ch, "followup-forged", forged)
	case n == 3 && ch != nil && other != nil:
		ref := other.ref
		op := c.invoke(&Op{Kind: OpForeign, ForeignKind: "interrupt-other-root", Sender: other.id, Child: ch.id, Root: ch.root.id})
		err := c.call(protocol.EpContinuableInterrupt, protocol.InterruptRequest{ChildID: ch.id, Authority: protocol.Authority{Parent: &ref}}, &struct{}{})
		c.w.rec.Complete(op, err)
	case n == 4 && other != nil:
		r := c.pickRoot()
		if r == nil || r == other {
			return
		}
		runID, child := c.inflightRun(r)
		if runID == "" {
			return
		}
		ref := other.ref
		op := c.invoke(&Op{Kind: OpForeign, ForeignKind: "dispose-other-root", Sender: other.id, RunID: runID, Child: child, Root: r.id})
		err := c.call(protocol.EpRunsDispose, protocol.RunRef{RunID: runID, Parent: &ref}, &protocol.RunStatus{})
		c.w.rec.Complete(op, err)
	case n == 5 && dead != nil:
		op := c.invoke(&Op{Kind: OpForeign, ForeignKind: "run-dead-root", Sender: dead.id, Parent: dead.id, Root: dead.id})
		marker := Marker(op.ID)
		c.w.rec.Update(op, func(o *Op) { o.Marker = marker })
		err := c.call(protocol.EpRunsStart, protocol.RunStartRequest{
			Provider: c.w.cfg.Provider, Parent: dead.ref, Prompt: protocol.Text("say " + marker),
		}, &protocol.RunStartReply{})
		c.w.rec.Complete(op, err)
	}
}

func (c *wclient) foreignFollowup(ch *wchild, kind string, ref protocol.ParentRef) {
	op := c.invoke(&Op{Kind: OpForeign, ForeignKind: kind, Sender: ref.SessionID, Child: ch.id, Root: ch.root.id})
	marker := Marker(op.ID)
	c.w.rec.Update(op, func(o *Op) { o.Marker = marker })
	err := c.call(protocol.EpContinuableFollowup, protocol.FollowupRequest{
		ChildID: ch.id, Authority: protocol.Authority{Parent: &ref}, Message: protocol.Text("say " + marker),
	}, &protocol.FollowupReply{})
	c.w.rec.Complete(op, err)
}

// --- the end ---------------------------------------------------------------

// finishSendersMax bounds the last messages a client sends at once.
const finishSendersMax = 8

// lastMessage sends ch one last message as s, retried until it is accepted,
// the child turns out never to have been created, or the budget ends.
func (c *wclient) lastMessage(ctx context.Context, ch *wchild, s sender) {
	deadline := time.Now().Add(2 * c.w.cfg.RetryBudget)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		op := c.followup(ch, s, true, 0)
		if op.Outcome == OutcomeOK || (op.Outcome == OutcomeFail && op.Code != string(protocol.CodeDraining)) {
			return // accepted, or refused for good (a child whose start never landed)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// finish lifts this client's drains and sends every continuable child one
// last message from the client's grant, retried until it is accepted (or
// the child turns out never to have been created).
func (c *wclient) finish(ctx context.Context) {
	deadline := time.Now().Add(c.w.cfg.RetryBudget)
	for c.userGrant() == "" && time.Now().Before(deadline) && ctx.Err() == nil {
		c.mintGrant(ctx)
	}
	c.liftAll(ctx)
	all := c.allChildren()
	seen := map[string]bool{}
	s := sender{"grant:" + c.name, protocol.Authority{Grant: c.userGrant()}}
	work := make(chan *wchild)
	var wg sync.WaitGroup
	for i := 0; i < finishSendersMax; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ch := range work {
				c.lastMessage(ctx, ch, s)
			}
		}()
	}
	for _, ch := range all {
		if !seen[ch.id] {
			seen[ch.id] = true
			work <- ch
		}
	}
	close(work)
	wg.Wait()
}
