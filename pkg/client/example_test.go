package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/dev"
)

// natsURL is the deployment the examples run against: a `brood dev` (here
// started in-process by TestMain, on a free loopback port).
var natsURL string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "brood-client-examples-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	d, err := dev.Start(context.Background(), dev.Config{DataDir: dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	natsURL = d.URL()
	code := m.Run()
	d.Stop()
	os.RemoveAll(dir)
	// Nothing the client or the deployment started outlives them.
	if err := goleak.Find(); err != nil && code == 0 {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		code = 1
	}
	os.Exit(code)
}

// connect is how every example starts: a NATS connection and a client.
func connect() (*nats.Conn, *client.Client) {
	nc, err := nats.Connect(natsURL)
	if err != nil {
		panic(err)
	}
	cl, err := client.New(nc, client.Options{})
	if err != nil {
		panic(err)
	}
	return nc, cl
}

// Delegate a task: open a root agent, start a one-shot child on the spawn
// provider, wait for its result.
func Example() {
	nc, cl := connect()
	defer nc.Close()
	ctx := context.Background()

	root, err := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: os.TempDir()})
	if err != nil {
		panic(err)
	}
	defer root.Close(ctx)
	run, err := cl.StartRun(ctx, protocol.RunStartRequest{
		Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text("say Hello from a child agent"),
	})
	if err != nil {
		panic(err)
	}
	res, err := run.Result(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(res.StopReason, protocol.PlainText(res.Output))
	// Output: completed Hello from a child agent
}

// A child asked for structured output returns a value valid against the
// schema (the scripted model's `json` line stands in for a model).
func ExampleClient_StartRun_structuredOutput() {
	nc, cl := connect()
	defer nc.Close()
	ctx := context.Background()
	root, _ := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: os.TempDir()})
	defer root.Close(ctx)

	schema := map[string]any{"type": "object", "properties": map[string]any{"answer": map[string]any{"type": "integer"}}, "required": []any{"answer"}}
	run, err := cl.StartRun(ctx, protocol.RunStartRequest{
		Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text(`json {"answer":42}`),
		Options: protocol.StartOptions{OutputSchema: schema},
	})
	if err != nil {
		panic(err)
	}
	res, _ := run.Result(ctx)
	out, _ := json.Marshal(res.Structured)
	fmt.Println(res.StopReason, string(out))
	// Output: completed {"answer":42}
}

// A root's client reads the settlement notices of its background
// (continuable) children from the root's inbox, and deletes them.
func ExampleRoot_Notices() {
	nc, cl := connect()
	defer nc.Close()
	ctx := context.Background()
	root, _ := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: os.TempDir()})
	defer root.Close(ctx)

	if _, err := cl.StartContinuable(ctx, protocol.ContinuableStartRequest{
		Provider: "spawn", Parent: root.Ref(), Label: "background job", Prompt: protocol.Text("say all done"),
	}); err != nil {
		panic(err)
	}
	var notices []protocol.InboxItem
	for len(notices) == 0 {
		items, err := root.Notices(ctx, protocol.InboxReadRequest{WaitMs: 10_000})
		if err != nil {
			panic(err)
		}
		notices = append(notices, items...)
	}
	n := notices[0]
	_, closing, _ := strings.Cut(protocol.AllText(n.Content), "Closing message:\n")
	fmt.Println(n.Source.Kind, n.Delivery, closing)
	page, _ := root.Inbox(ctx, protocol.InboxReadRequest{})
	fmt.Println("still pending:", len(page.Items))
	// Output:
	// subagent-settled next-step all done
	// still pending: 0
}

// A root reads the log of a child it started (any session of its subtree),
// through the coordinator.
func ExampleClient_Log() {
	nc, cl := connect()
	defer nc.Close()
	ctx := context.Background()
	root, _ := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: os.TempDir()})
	defer root.Close(ctx)
	run, _ := cl.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text("say ok")})
	if _, err := run.Result(ctx); err != nil {
		panic(err)
	}

	l, err := cl.Log(ctx, protocol.LogReadRequest{SessionID: run.ChildID, Authority: root.Authority()})
	if err != nil {
		panic(err)
	}
	fmt.Println(l.Header.ParentSession == root.SessionID, l.Header.DelegationDepth)
	for _, ev := range l.Events {
		fmt.Println(ev.Seq, ev.Type)
	}
	// Output:
	// true 1
	// 0 turn/start
	// 1 user/message
	// 2 subagent/descriptor
	// 3 step/start
	// 4 assistant/message
	// 5 step/end
	// 6 turn/end
}

// Follow the lifecycle events of a root's subtree as they happen; the
// events arrive under the client's own inbox prefix, with credit.
func ExampleClient_Follow() {
	nc, cl := connect()
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	root, _ := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: os.TempDir()})
	defer root.Close(context.Background())

	f, err := cl.Follow(ctx, protocol.EventsFollowRequest{Parent: root.SessionID, Descendants: true, Authority: root.Authority()})
	if err != nil {
		panic(err)
	}
	defer f.Close()
	run, _ := cl.StartRun(ctx, protocol.RunStartRequest{
		Provider: "spawn", Parent: root.Ref(),
		Prompt: protocol.Text(`call subagent {"description":"go deeper","prompt":"say deep"}` + "\nsay done"),
	})
	for i := 0; i < 4; i++ {
		ev, err := f.Next(ctx)
		if err != nil {
			panic(err)
		}
		who := "grandchild"
		if ev.ID == run.ChildID {
			who = "child"
		}
		fmt.Println(strings.TrimSpace(fmt.Sprint(ev.Type, " ", who, " ", ev.StopReason)))
	}
	// Output:
	// subagent/start child
	// subagent/start grandchild
	// subagent/end grandchild completed
	// subagent/end child completed
}

// Past lifecycle events, page by page: each carries its stream sequence, and
// a page's cursor is where the next one starts.
func ExampleClient_Events() {
	nc, cl := connect()
	defer nc.Close()
	ctx := context.Background()
	root, _ := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: os.TempDir()})
	defer root.Close(ctx)
	for _, prompt := range []string{"say one", "say two"} {
		run, _ := cl.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text(prompt)})
		if _, err := run.Result(ctx); err != nil {
			panic(err)
		}
	}

	// Lifecycle events are stored off the runs' path, a moment after their
	// results arrive: read on from the cursor until all four are there.
	var seen []protocol.LifecycleEvent
	req := protocol.EventsReadRequest{Parent: root.SessionID, Authority: root.Authority(), EventsMax: 3}
	for len(seen) < 4 {
		page, err := cl.Events(ctx, req)
		if err != nil {
			panic(err)
		}
		seen = append(seen, page.Events...)
		req.AfterSeq = page.Cursor
		if page.Complete && len(seen) < 4 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, ev := range seen {
		fmt.Println(strings.TrimSpace(ev.Type + " " + protocol.PlainText(ev.LastAssistantMessage)))
	}
	// Output:
	// subagent/start
	// subagent/end one
	// subagent/start
	// subagent/end two
}

// Every error is a *protocol.Error with a catalogue code: match it with
// errors.Is or read it with errors.As. An error the client made itself also
// wraps its cause.
func Example_errors() {
	nc, cl := connect()
	defer nc.Close()
	ctx := context.Background()
	root, _ := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: os.TempDir()})
	defer root.Close(ctx)

	_, err := cl.StartRun(ctx, protocol.RunStartRequest{Provider: "nope", Parent: root.Ref(), Prompt: protocol.Text("x")})
	var pe *protocol.Error
	fmt.Println(errors.Is(err, protocol.ErrNoProvider), errors.As(err, &pe), pe.Code, pe.Code.Number(), pe.Details["provider"])

	expired, cancel := context.WithDeadline(ctx, time.Now())
	defer cancel()
	_, err = cl.Providers(expired)
	fmt.Println(errors.Is(err, protocol.ErrUnavailable), errors.Is(err, context.DeadlineExceeded))
	// Output:
	// true true NO_PROVIDER 1002 nope
	// true true
}

// A child that does not complete is a result, not an error; ResultError
// turns such a result into a *client.RunError for callers that treat it as
// a failure: it carries the result and matches the catalogue code of the
// run's end (its errorCode, CANCELLED for aborted, INTERNAL otherwise).
func ExampleResultError() {
	nc, cl := connect()
	defer nc.Close()
	ctx := context.Background()
	root, _ := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: os.TempDir()})
	defer root.Close(ctx)

	run, err := cl.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text("refuse")})
	if err != nil {
		panic(err)
	}
	res, err := run.Result(ctx)
	if err != nil {
		panic(err)
	}
	err = client.ResultError(res)
	var runErr *client.RunError
	fmt.Println(errors.As(err, &runErr), runErr.StopReason(), runErr.Code(), errors.Is(err, protocol.ErrInternal))
	// Output: true refusal INTERNAL true
}

// A continuable child takes more turns with followups; its state says
// whether an activation holds it.
func ExampleClient_Followup() {
	nc, cl := connect()
	defer nc.Close()
	ctx := context.Background()
	root, _ := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: os.TempDir()})
	defer root.Close(ctx)

	start, err := cl.StartContinuable(ctx, protocol.ContinuableStartRequest{
		Provider: "spawn", Parent: root.Ref(), Label: "helper", Prompt: protocol.Text("say first"),
	})
	if err != nil {
		panic(err)
	}
	if _, err := cl.Followup(ctx, protocol.FollowupRequest{ChildID: start.ChildID, Authority: root.Authority(), Message: protocol.Text("say second")}); err != nil {
		panic(err)
	}
	// Each epoch ends with a notice; read until the second answer came.
	for seen := ""; !strings.Contains(seen, "second"); {
		items, err := root.Notices(ctx, protocol.InboxReadRequest{WaitMs: 10_000})
		if err != nil {
			panic(err)
		}
		for _, it := range items {
			seen += protocol.AllText(it.Content)
		}
	}
	for {
		st, err := cl.State(ctx, protocol.ChildRef{ChildID: start.ChildID, Authority: root.Authority()})
		if err != nil {
			panic(err)
		}
		if st.State == protocol.StateNone {
			fmt.Println(st.State)
			break
		}
		time.Sleep(50 * time.Millisecond) // the activation settles a moment after its last turn
	}
	list, _ := cl.Children(ctx, protocol.ChildrenListRequest{Parent: root.SessionID, Authority: root.Authority()})
	fmt.Println(len(list.Rows), list.Rows[0].Mode, list.Rows[0].Label)
	// Output:
	// none
	// 1 continuable helper
}
