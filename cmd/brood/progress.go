package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Progress modes of --progress.
const (
	progressAuto   = "auto"
	progressAlways = "always"
	progressNever  = "never"
)

// progressTick is how often the status line's elapsed time is redrawn.
const progressTick = 200 * time.Millisecond

func progressFlag(cmd *cobra.Command, mode *string) {
	cmd.Flags().StringVar(mode, "progress", progressAuto,
		"show the child's tool calls, descendants and elapsed time on stderr while waiting: auto (when stdout and stderr are terminals), always, never")
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// wantProgress decides --progress: auto shows it only on a terminal, so a
// piped command prints only the result.
func wantProgress(mode string, s *session) (bool, error) {
	switch mode {
	case progressAlways:
		return true, nil
	case progressNever:
		return false, nil
	case progressAuto, "":
		return isTerminal(s.out) && isTerminal(s.errOut), nil
	}
	return false, protocol.Errorf(protocol.CodeInvalidArgument, "--progress %q must be auto, always or never", mode)
}

// progress shows, on stderr, what a child does while a verb waits for it:
// its tool calls and its descendants as they start and end, each line
// stamped with the elapsed time, under a status line redrawn in place. It
// reads through the coordinator with the verb's authority: the child's log
// (sessions.log, long polls) and its subtree's lifecycle events
// (events.follow).
type progress struct {
	w     io.Writer
	start time.Time
	child string
	ctx   context.Context
	stop  context.CancelFunc
	cl    *client.Client
	done  sync.WaitGroup

	status bool // a status line is drawn (stderr is a terminal)

	// top is the session whose subtree is followed; a node's indent is its
	// depth below top, less base (1 when top is the child's parent).
	top  string
	base int

	mu        sync.Mutex
	drawn     bool // a status line is on screen
	calls     map[string]time.Time
	callsDone int
	parentOf  map[string]string    // every session seen in the subtree
	started   map[string]time.Time // descendants running
	kids      int
	spin      int
}

// newProgress starts following the lifecycle events of top's subtree (open
// it before the child starts: top is the child's parent when base is 1, the
// child itself when base is 0), and, once followLog names the child, its log.
func newProgress(ctx context.Context, s *session, top string, base int, auth protocol.Authority) (*progress, error) {
	f, err := s.cl.Follow(ctx, protocol.EventsFollowRequest{Parent: top, Descendants: true, Authority: auth})
	if err != nil {
		return nil, err
	}
	pctx, stop := context.WithCancel(ctx)
	p := &progress{w: s.errOut, start: time.Now(), ctx: pctx, stop: stop, cl: s.cl, status: isTerminal(s.errOut),
		top: top, base: base, calls: map[string]time.Time{}, parentOf: map[string]string{}, started: map[string]time.Time{}}
	p.done.Add(2)
	go func() { defer p.done.Done(); defer f.Close(); p.followEvents(pctx, f) }()
	go func() { defer p.done.Done(); p.tick(pctx) }()
	return p, nil
}

// followLog shows the tool calls among the child's events that keep says
// to (nil: all), until finish.
func (p *progress) followLog(child string, auth protocol.Authority, keep func(protocol.SessionEvent) bool) {
	ctx, cl := p.ctx, p.cl
	p.watchChild(child)
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		req := protocol.LogReadRequest{SessionID: child, Authority: auth, WaitMs: 10_000}
		read := func(ctx context.Context) (bool, error) {
			page, err := cl.LogPage(ctx, req)
			if err != nil {
				return false, err
			}
			for _, ev := range page.Events {
				if keep == nil || keep(ev) {
					p.onEvent(ev)
				}
			}
			req.FromSeq, req.Cursor = page.NextSeq, page.Cursor
			return page.Complete, nil
		}
		for ctx.Err() == nil {
			if _, err := read(ctx); err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}
		// finish: what was logged up to now is shown too (bounded).
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		req.WaitMs = 0
		for cctx.Err() == nil {
			if complete, err := read(cctx); err != nil || complete {
				return
			}
		}
	}()
}

// watchChild names the child whose descendants and tool calls are shown.
func (p *progress) watchChild(child string) {
	p.mu.Lock()
	p.child = child
	p.mu.Unlock()
}

// indentLocked is the depth of id below top, less base.
func (p *progress) indentLocked(id string) int {
	d := 0
	for cur := id; cur != p.top && cur != "" && d < 64; d++ {
		cur = p.parentOf[cur]
	}
	return max(d-p.base, 0)
}

// onEvent shows a tool call starting or ending.
func (p *progress) onEvent(ev protocol.SessionEvent) {
	switch ev.Type {
	case protocol.EvToolCall:
		var d protocol.ToolCallData
		if ev.Decode(&d) != nil {
			return
		}
		p.mu.Lock()
		p.calls[d.CallID] = time.Now()
		p.mu.Unlock()
		if args := clipArgs(d.Arguments); args != "" {
			p.line(0, "tool %s %s", d.Name, args)
		} else {
			p.line(0, "tool %s", d.Name)
		}
	case protocol.EvToolResult:
		var d protocol.ToolResultData
		if ev.Decode(&d) != nil {
			return
		}
		p.mu.Lock()
		began, ok := p.calls[d.CallID]
		delete(p.calls, d.CallID)
		p.callsDone++
		p.mu.Unlock()
		how := "done"
		if d.IsError {
			how = "failed: " + clip(headlineOf(d.Content))
		}
		took := ""
		if ok {
			took = " (" + elapsed(time.Since(began)) + ")"
		}
		p.line(0, "tool %s %s%s", d.Name, how, took)
	}
}

func headlineOf(content []protocol.ContentBlock) string {
	text := protocol.PlainText(content)
	if i := strings.IndexByte(text, '\n'); i >= 0 {
		text = text[:i]
	}
	return text
}

func clipArgs(args string) string {
	args = strings.TrimSpace(args)
	if args == "" || args == "{}" {
		return ""
	}
	if r := []rune(args); len(r) > 60 {
		args = string(r[:59]) + "…"
	}
	return strings.ReplaceAll(args, "\n", " ")
}

// followEvents shows descendants starting and ending.
func (p *progress) followEvents(ctx context.Context, f *client.Follow) {
	for {
		ev, err := f.Next(ctx)
		if err != nil {
			return
		}
		p.mu.Lock()
		p.parentOf[ev.ID] = ev.ParentSession
		d := p.indentLocked(ev.ID)
		// The child's own start and end are not its progress (a run's child
		// is known a moment after its children may start: only its parent,
		// top, is for sure).
		self := ev.ID == p.child || (p.base == 1 && ev.ParentSession == p.top)
		p.mu.Unlock()
		if self {
			continue
		}
		switch ev.Type {
		case protocol.LifecycleStart:
			p.mu.Lock()
			p.started[ev.ID] = time.Now()
			p.kids++
			p.mu.Unlock()
			p.line(d, "child %s (%s%s) started", ev.ID, ev.Provider, modeNote(ev.Mode))
		case protocol.LifecycleEnd:
			p.mu.Lock()
			began, ok := p.started[ev.ID]
			delete(p.started, ev.ID)
			p.mu.Unlock()
			how := string(ev.StopReason)
			if ev.ErrorCode != "" {
				how += " " + string(ev.ErrorCode)
			}
			if ok {
				how += " (" + elapsed(time.Since(began)) + ")"
			}
			p.line(d, "child %s %s", ev.ID, how)
		}
	}
}

func modeNote(mode string) string {
	if mode == protocol.ModeContinuable {
		return ", continuable"
	}
	return ""
}

func elapsed(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	if d < time.Minute {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return d.Truncate(time.Second).String()
}

// line prints one progress line above the status line.
func (p *progress) line(indent int, format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
	fmt.Fprintf(p.w, "[%6s] %s%s\n", elapsed(time.Since(p.start)), strings.Repeat("  ", indent), fmt.Sprintf(format, args...))
	p.drawLocked()
}

var spinner = []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}

func (p *progress) tick(ctx context.Context) {
	t := time.NewTicker(progressTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.mu.Lock()
			p.spin++
			p.clearLocked()
			p.drawLocked()
			p.mu.Unlock()
		}
	}
}

func (p *progress) clearLocked() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}

func (p *progress) drawLocked() {
	if !p.status {
		return
	}
	who := "starting"
	if p.child != "" {
		who = p.child
	}
	status := fmt.Sprintf("%s %s · %s · %d tool calls", spinner[p.spin%len(spinner)], who, elapsed(time.Since(p.start)), p.callsDone+len(p.calls))
	if len(p.calls) > 0 {
		status += fmt.Sprintf(" (%d running)", len(p.calls))
	}
	if p.kids > 0 {
		status += fmt.Sprintf(" · %d descendants", p.kids)
		if len(p.started) > 0 {
			status += fmt.Sprintf(" (%d running)", len(p.started))
		}
	}
	fmt.Fprint(p.w, status)
	p.drawn = true
}

// FinishEventsWait bounds how long finish waits for the ends of descendants
// it showed started.
const FinishEventsWait = 2 * time.Second

// finish stops following and clears the status line. Lifecycle events are
// stored a moment after a result may arrive (docs/protocol.md §5.19), so a
// descendant shown started is given up to FinishEventsWait for its end to be
// shown too (a run's end disposed its one-shot descendants; a continuable
// one that lives on only costs the wait).
func (p *progress) finish() {
	for end := time.Now().Add(FinishEventsWait); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		p.mu.Lock()
		open := len(p.started)
		p.mu.Unlock()
		if open == 0 || p.ctx.Err() != nil {
			break
		}
	}
	p.stop()
	p.done.Wait()
	p.mu.Lock()
	p.clearLocked()
	p.mu.Unlock()
}
