package rpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/rpc"
)

// TestAParkedHandlerHoldsNoSlot: with one request slot, a handler that
// waits holds it and the next request waits behind it; one that parks
// before it waits (a long poll) leaves the slot to the next request, which
// is answered while the first still waits (issue 29, item 4).
func TestAParkedHandlerHoldsNoSlot(t *testing.T) {
	for _, park := range []bool{false, true} {
		name := map[bool]string{false: "held", true: "parked"}[park]
		t.Run(name, func(t *testing.T) {
			release := make(chan struct{})
			waiting := make(chan struct{}, 1)
			nc, _, _ := serve(t, 1, func(ctx context.Context, req rpc.Request) (any, error) {
				var in echo
				if err := req.Decode(&in); err != nil {
					return nil, err
				}
				if in.Text != "wait" {
					return echo{"quick"}, nil
				}
				if park {
					rpc.Park(ctx)
					rpc.Park(ctx) // twice is once
				}
				waiting <- struct{}{}
				select {
				case <-release:
				case <-ctx.Done():
				}
				return echo{"waited"}, nil
			})
			done := make(chan error, 1)
			go func() { done <- rpc.Call(context.Background(), nc, "test.work", echo{"wait"}, nil) }()
			<-waiting
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var got echo
			err := rpc.Call(ctx, nc, "test.work", echo{"quick"}, &got)
			close(release)
			if park && (err != nil || got.Text != "quick") {
				t.Fatalf("a request beside a parked handler: %+v, %v", got, err)
			}
			if !park && err == nil {
				t.Fatal("a request was served while the only slot was held")
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}
