package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// BroodPackage is the brood command, built in the calling module (which
// must require github.com/brood-dev/brood).
const BroodPackage = "github.com/brood-dev/brood/cmd/brood"

// BuildTimeout bounds one `go build` (a cold build cache on 2 cores).
const BuildTimeout = 5 * time.Minute

// Build runs `go build` for the brood binary into dir and returns its path.
// The Go build cache makes a second build cheap. Flags (for example
// "-race") are passed to go build.
func Build(ctx context.Context, dir string, flags ...string) (string, error) {
	out := filepath.Join(dir, "brood")
	bctx, cancel := context.WithTimeout(ctx, BuildTimeout)
	defer cancel()
	args := append(append([]string{"build", "-o", out}, flags...), BroodPackage)
	cmd := exec.CommandContext(bctx, "go", args...)
	cmd.Env = os.Environ()
	if o, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("chaos: go %s: %v\n%s", strings.Join(args, " "), err, o)
	}
	return out, nil
}

// ServerCommand is the ClusterConfig.ServerCommand that runs nodes with the
// nats-server the brood binary embeds.
func ServerCommand(brood string) []string { return []string{brood, "nats-server", "--config"} }
