package worker

import (
	"context"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/pkg/protocol"
)

// The host's endpoint table (hostHandler) answers each operation of
// <prefix>.v1.host.<hostId>.<op> in its reply shape: a child with nothing
// resident here is StateNone to state and to a dispose without a run id, an
// interrupt of it is {}, a dispose of a run the host does not hold is
// NOT_FOUND; a body of another shape and an unknown operation are
// INVALID_ARGUMENT.
func TestHostOperationsAnswerTheirShapes(t *testing.T) {
	h, _, nc := testHost(t, nil)
	srv := rpc.NewServer(nc, 8, h.log)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Stop(ctx)
	})
	if err := srv.Handle(h.subj.HostAll(h.id), h.hostHandler()); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	subject := func(op string) string { return h.subj.Host(h.id, op) }

	var st protocol.StateReply
	if err := rpc.Call(ctx, nc, subject(protocol.OpHostState), protocol.HostChildRequest{ChildID: "C1"}, &st); err != nil ||
		st.ChildID != "C1" || st.State != protocol.StateNone {
		t.Errorf("state of a child not resident: %+v, %v; want %s", st, err, protocol.StateNone)
	}
	st = protocol.StateReply{}
	if err := rpc.Call(ctx, nc, subject(protocol.OpHostDispose), protocol.HostRunRequest{ChildID: "C1"}, &st); err != nil ||
		st.ChildID != "C1" || st.State != protocol.StateNone {
		t.Errorf("dispose of an activation not resident: %+v, %v; want %s", st, err, protocol.StateNone)
	}
	var empty protocol.Empty
	if err := rpc.Call(ctx, nc, subject(protocol.OpHostInterrupt), protocol.HostChildRequest{ChildID: "C1"}, &empty); err != nil {
		t.Errorf("interrupt of a child not resident: %v, want {}", err)
	}
	for _, op := range []string{protocol.OpHostDispose, protocol.OpHostCancel} {
		err := rpc.Call(ctx, nc, subject(op), protocol.HostRunRequest{RunID: "R1", ChildID: "C1"}, &st)
		if protocol.CodeOf(err) != protocol.CodeNotFound {
			t.Errorf("%s of a run not held here: %v, want NOT_FOUND", op, err)
		}
	}
	if err := rpc.Call(ctx, nc, subject(protocol.OpHostState), []int{1, 2}, &st); protocol.CodeOf(err) != protocol.CodeInvalidArgument {
		t.Errorf("a body of another shape: %v, want INVALID_ARGUMENT", err)
	}
	if err := rpc.Call(ctx, nc, subject("resume"), protocol.HostChildRequest{ChildID: "C1"}, &st); protocol.CodeOf(err) != protocol.CodeInvalidArgument {
		t.Errorf("an unknown operation: %v, want INVALID_ARGUMENT", err)
	}
}
