package webui

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// chromiumPath is Debian's chromium, installed by `make ui-deps` (which
// `make test` runs); BROOD_CHROMIUM overrides it.
func chromiumPath(t *testing.T) string {
	t.Helper()
	p := os.Getenv("BROOD_CHROMIUM")
	if p == "" {
		p = "/usr/bin/chromium"
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is missing: run `make ui-deps` (apt-get install chromium), or set BROOD_CHROMIUM", p)
	}
	return p
}

// browser is a headless Chromium tab driven over the DevTools protocol.
type browser struct {
	t   *testing.T
	ctx context.Context
}

// newBrowser starts headless Chromium with a fresh profile and the flags this
// machine's closed network needs (no background connections).
func newBrowser(t *testing.T) *browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	b := &browser{t: t, ctx: ctx}
	t.Cleanup(func() {
		if t.Failed() {
			b.screenshot(filepath.Join("testdata", "failures", t.Name()+".png"))
		}
	})
	return b
}

// screenshot writes the tab as a PNG to path (the directory is created).
func (b *browser) screenshot(path string) {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	buf, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err == nil {
		_ = os.MkdirAll(filepath.Dir(path), 0o755)
		err = os.WriteFile(path, buf, 0o644)
	}
	if err != nil {
		b.t.Logf("screenshot %s: %v", path, err)
		return
	}
	abs, _ := filepath.Abs(path)
	b.t.Logf("screenshot kept: %s", abs)
}

func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression in the page.
func (b *browser) eval(expr string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitFor polls a JavaScript condition until it holds (a generous deadline
// for a loaded machine).
func (b *browser) waitFor(what, cond string) {
	b.t.Helper()
	testutil.Eventually(b.t, 30*time.Second, func() bool { return b.eval("String(!!("+cond+"))") == "true" }, "in the page: %s", what)
}

func sel(format string, args ...any) string {
	return fmt.Sprintf("document.querySelector(%q)", fmt.Sprintf(format, args...))
}

// TestBrowserShowsTheTreeGrowAndTheChildsLog is issue 11's browser test: the
// page is open while a nested delegation runs; the tree grows (the child,
// then the grandchild its subagent call starts), the child's log renders as
// a conversation (its prompt, the subagent call with its arguments, then the
// result with a link to the grandchild, the answer), and the tree settles.
func TestBrowserShowsTheTreeGrowAndTheChildsLog(t *testing.T) {
	s, srv := stackServer(t, Config{})
	b := newBrowser(t)
	b.do("open the page", chromedp.Navigate(srv.URL()))
	b.waitFor("the tree stream is live", `document.getElementById("status").textContent === "live"`)

	root := s.Root()
	prompt := "sleep 1s\n" +
		`call subagent {"description":"grandchild","prompt":"call list_dir {}\nsleep 2s\nsay from the grandchild"}` + "\n" +
		"say done"
	run, err := s.Client.StartRun(context.Background(), protocol.RunStartRequest{
		Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text(prompt)})
	if err != nil {
		t.Fatal(err)
	}
	child := run.ChildID

	// The tree grows: the root with its child, then the grandchild under it.
	b.waitFor("the child in the tree, running", sel(`.row[data-id=%q][data-state="running"]`, child))
	b.waitFor("the root above it", sel(`li[data-node=%q] > ul.children > li[data-node=%q]`, root.SessionID, child))
	b.waitFor("a grandchild under the child", sel(`li[data-node=%q] > ul.children > li .row[data-state="running"]`, child))
	grandchild := b.eval(sel(`li[data-node=%q] > ul.children > li .row`, child) + `.dataset.id`)
	if grandchild == "" || grandchild == child {
		t.Fatalf("grandchild id %q", grandchild)
	}

	// The child's log while its subagent call runs: the prompt, the call
	// with its arguments, a link to the running grandchild.
	b.do("open the child's session", chromedp.Click(chromedp.CSS(fmt.Sprintf(`.row[data-id=%q]`, child))))
	b.waitFor("the child's log", sel(`#log[data-session=%q]`, child))
	b.waitFor("its prompt", sel(`#log .msg.user`)+`?.textContent?.includes("call subagent")`)
	b.waitFor("the subagent call, pending", sel(`#log details.tool.pending[data-tool="subagent"]`))
	if args := b.eval(sel(`#log details.tool[data-tool="subagent"] pre.args`) + `.textContent`); !strings.Contains(args, `"description": "grandchild"`) {
		t.Fatalf("the call's arguments render as %q", args)
	}
	b.waitFor("a link to the running grandchild", sel(`#children-of a.child-link[data-session=%q]`, grandchild))

	// Live turns: the result arrives with the grandchild's answer and link,
	// then the child's own answer; the tree settles.
	b.waitFor("the call's result", sel(`#log details.tool[data-tool="subagent"][data-result="ok"] pre.result`)+`?.textContent?.includes("from the grandchild")`)
	b.waitFor("the result links the grandchild", sel(`#log details.tool[data-tool="subagent"] a.session-link[data-session=%q]`, grandchild))
	b.waitFor("the child's answer", sel(`#log .msg.assistant`)+`?.textContent?.includes("done")`)
	b.waitFor("the child's turn end", sel(`#log [data-type="turn/end"]`)+`?.textContent?.includes("completed")`)
	b.waitFor("the child settled in the tree", sel(`.row[data-id=%q][data-state="settled"] [data-stop-reason="completed"]`, child))
	b.waitFor("the grandchild settled in the tree", sel(`.row[data-id=%q][data-state="settled"]`, grandchild))

	// Following the link opens the grandchild's conversation.
	b.do("follow the link to the grandchild", chromedp.Click(chromedp.CSS(fmt.Sprintf(`#children-of a[data-session=%q]`, grandchild))))
	b.waitFor("the grandchild's log", sel(`#log[data-session=%q]`, grandchild))
	b.waitFor("its list_dir call", sel(`#log details.tool[data-tool="list_dir"][data-result="ok"]`))
	b.waitFor("its answer", sel(`#log .msg.assistant`)+`?.textContent?.includes("from the grandchild")`)
	b.waitFor("its parent link", sel(`dl.meta a[data-session=%q]`, child))

	if res, err := run.Result(context.Background()); err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("run result %+v, %v", res, err)
	}
	if path := os.Getenv("BROOD_UI_SCREENSHOT"); path != "" {
		b.do("open the child's session again", chromedp.Navigate(srv.URL()+"#/s/"+child))
		b.waitFor("the child's answer", sel(`#log .msg.assistant`)+`?.textContent?.includes("done")`)
		b.screenshot(path)
	}
}
