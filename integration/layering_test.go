package integration

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The layering of the module (cmd → services → internal → pkg; issue 13),
// checked on what the go tool resolves: a leaf package's tests build no
// service and no worker host (the test harness that runs a deployment is
// internal/testutil/stack, apart from internal/testutil), pkg/client talks
// to Brood over the wire only (no internal/ package), and pkg/protocol,
// the wire contract, stands on nothing of Brood's, and the coordinator
// settles runs and keeps ownership through the store's operations, not
// internal/worker.
func TestLayering(t *testing.T) {
	const mod = "github.com/brood-dev/brood/"
	for _, tc := range []struct {
		pkg       string
		test      bool // with its tests' dependencies
		forbidden []string
	}{
		{"internal/store", true, []string{"services/", "internal/worker", "internal/testutil/stack"}},
		{"internal/agent", true, []string{"services/", "internal/worker", "internal/testutil/stack"}},
		{"internal/model", true, []string{"services/", "internal/worker", "internal/testutil/stack"}},
		{"internal/sessionlog", true, []string{"services/", "internal/worker", "internal/store", "internal/testutil"}},
		{"internal/rpc", true, []string{"services/", "internal/worker", "internal/testutil/stack"}},
		{"pkg/protocol", false, []string{"services/", "internal/"}},
		{"pkg/protocol", true, []string{"services/", "internal/worker", "internal/store", "internal/testutil/stack"}},
		{"internal/testutil", false, []string{"services/", "internal/worker"}},
		{"pkg/client", false, []string{"internal/", "services/"}},
		// Settlement, ownership, leases and heartbeats are store operations:
		// the coordinator builds on no worker host; the checks of a start's
		// options (tool filter, persona, output schema) are pkg/protocol's,
		// so it builds on no agent runtime either (issue 30, item 1).
		// The coordinator's packages: the main one and its parts under it
		// (docs/architecture.md §6).
		{"services/coordinator/...", false, []string{"internal/worker", "internal/agent"}},
	} {
		args := []string{"list", "-deps"}
		if tc.test {
			args = append(args, "-test")
		}
		out, err := exec.Command("go", append(args, mod+tc.pkg)...).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", tc.pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			rel, ok := strings.CutPrefix(dep, mod)
			if !ok || strings.HasPrefix(rel, strings.TrimSuffix(tc.pkg, "/...")) {
				continue
			}
			for _, f := range tc.forbidden {
				if strings.HasPrefix(rel, f) {
					t.Errorf("%s (tests: %v) depends on %s", tc.pkg, tc.test, rel)
				}
			}
		}
	}
}

// The in-repo providers reach the host framework only through the public
// provider SDK (pkg/provider; issue 30, item 2), as a third party would:
// neither their code nor their tests import internal/worker, and each
// imports pkg/provider.
func TestProvidersUseTheSDK(t *testing.T) {
	const mod = "github.com/brood-dev/brood/"
	for _, pkg := range []string{"services/spawn-worker", "services/fork-worker", "services/acp-bridge"} {
		out, err := exec.Command("go", "list", "-f", `{{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`, mod+pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		imports := strings.Fields(string(out))
		if slices.Contains(imports, mod+"internal/worker") {
			t.Errorf("%s imports internal/worker directly", pkg)
		}
		if !slices.Contains(imports, mod+"pkg/provider") {
			t.Errorf("%s does not import pkg/provider", pkg)
		}
	}
}
