package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

func connectTo(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestCallWaitsOutNoResponders: a request that reaches no coordinator (they
// are reconnecting after their NATS server went away) is sent again until
// one subscribes, within NoRespondersRetryMax; with none at all the caller
// hears UNAVAILABLE once that passed, well before its timeout.
func TestCallWaitsOutNoResponders(t *testing.T) {
	url := coreServer(t)
	nc := connectTo(t, url)
	cl, err := client.New(nc, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	began := time.Now()
	_, err = cl.Providers(ctx)
	if !errors.Is(err, protocol.ErrUnavailable) || !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("with no coordinator: %v", err)
	}
	if took := time.Since(began); took < client.NoRespondersRetryMax/2 || took > client.NoRespondersRetryMax+2*time.Second {
		t.Fatalf("with no coordinator the call took %s; want about %s", took, client.NoRespondersRetryMax)
	}

	subj := cl.Subjects().Coord(protocol.EpProvidersList)
	answered := make(chan error, 1)
	go func() {
		_, err := cl.Providers(ctx)
		answered <- err
	}()
	time.Sleep(300 * time.Millisecond) // the call meets no responders meanwhile
	responder := connectTo(t, url)
	sub, err := responder.Subscribe(subj, func(m *nats.Msg) {
		data, _ := protocol.Marshal(protocol.Msgpack, protocol.ProvidersListReply{})
		_ = m.Respond(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := <-answered; err != nil {
		t.Fatalf("a coordinator that subscribed while the call waited: %v", err)
	}
}
