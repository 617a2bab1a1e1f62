package rpc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/pkg/protocol"
)

// rpc.Typed decodes the request as the handler's request shape and answers
// its reply shape: a body of another shape never reaches the handler (it is
// INVALID_ARGUMENT), an error is answered as itself, and a handler of
// protocol.Empty takes a request with no body.
func TestTypedDecodesTheRequestAndAnswersTheReply(t *testing.T) {
	type greeting struct {
		Name string `msgpack:"name" json:"name"`
	}
	calls := 0
	h := rpc.Typed(func(_ context.Context, _ rpc.Request, in greeting) (echo, error) {
		calls++
		if in.Name == "" {
			return echo{}, protocol.Errorf(protocol.CodeNotFound, "nobody")
		}
		return echo{Text: "hello " + in.Name}, nil
	})
	nc, _, _ := serve(t, 4, h)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var out echo
	if err := rpc.Call(ctx, nc, "test.work", greeting{Name: "ada"}, &out); err != nil || out.Text != "hello ada" {
		t.Fatalf("call: %+v, %v", out, err)
	}
	if err := rpc.Call(ctx, nc, "test.work", greeting{}, &out); protocol.CodeOf(err) != protocol.CodeNotFound {
		t.Fatalf("a handler's error: %v, want NOT_FOUND", err)
	}
	before := calls
	if err := rpc.Call(ctx, nc, "test.work", []int{1, 2}, &out); protocol.CodeOf(err) != protocol.CodeInvalidArgument ||
		!strings.Contains(err.Error(), "not valid") {
		t.Fatalf("a body of another shape: %v, want INVALID_ARGUMENT", err)
	}
	if calls != before {
		t.Fatal("the handler ran on a body that did not decode")
	}
	msg, err := nc.RequestWithContext(ctx, "test.work", nil)
	if err != nil {
		t.Fatal(err)
	}
	if e := rpc.ErrorOf(msg); e == nil || e.Code != protocol.CodeInvalidArgument {
		t.Fatalf("an empty body: %v, want INVALID_ARGUMENT", e)
	}
}

func TestTypedTakesNoBodyForEmpty(t *testing.T) {
	h := rpc.Typed(func(context.Context, rpc.Request, protocol.Empty) (echo, error) { return echo{Text: "ok"}, nil })
	nc, _, _ := serve(t, 4, h)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, "test.work", nil)
	if err != nil {
		t.Fatal(err)
	}
	var out echo
	if e := rpc.ErrorOf(msg); e != nil {
		t.Fatalf("no body: %v", e)
	}
	if err := protocol.Unmarshal(protocol.Msgpack, msg.Data, &out); err != nil || out.Text != "ok" {
		t.Fatalf("reply %+v, %v", out, err)
	}
}
