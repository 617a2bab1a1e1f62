// Command echo is a complete Brood provider in a few dozen lines: its
// children answer every turn with the turn's prompt, prefixed by how many
// turns the child has taken. It uses only the public provider SDK
// (github.com/brood-dev/brood/pkg/provider).
//
// Against a `brood dev` on port 4300 (`brood dev --listen 127.0.0.1:4300`):
//
//	brood provision --nats nats://127.0.0.1:4300 --providers spawn,fork,acp,echo
//	go run ./pkg/provider/examples/echo --nats nats://127.0.0.1:4300
//	brood run --nats nats://127.0.0.1:4300 --provider echo "hello"
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/pkg/provider"
)

func main() {
	url := flag.String("nats", nats.DefaultURL, "NATS URL of the deployment")
	prefix := flag.String("prefix", "brood", "subject prefix of the deployment")
	name := flag.String("name", "echo", "provider name")
	flag.Parse()

	nc, err := nats.Connect(*url, nats.Name("brood-echo-provider"))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	echo := provider.NewText(*name, func(_ context.Context, t provider.Turn) (string, error) {
		turns := (len(t.Messages) + 1) / 2
		return fmt.Sprintf("echo %d: %s", turns, t.Prompt()), nil
	})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	host, err := provider.Open(ctx, provider.Config{NC: nc, Prefix: *prefix, Providers: []provider.Provider{echo}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("serving", *name, "as host", host.ID())
	if err := host.Run(ctx); err != nil { // until SIGINT/SIGTERM, then a drain
		log.Fatal(err)
	}
}
