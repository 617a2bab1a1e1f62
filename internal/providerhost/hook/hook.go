// Package hook is the one seam between the public provider SDK
// (pkg/provider) and the module's own compositions (internal/providerhost):
// pkg/provider sets WrapHost when it is initialised, so that a composition
// inside the module can hand the SDK a host it built on what it already
// holds (its opened store, its metrics) and get the SDK's *provider.Host
// back, without pkg/provider's public API naming any internal type
// (integration/publicapi_test.go).
package hook

import "github.com/brood-dev/brood/internal/worker"

// WrapHost returns h as a *provider.Host (typed any, since this package
// cannot import pkg/provider, which imports it). Set by pkg/provider's init;
// never nil once pkg/provider is linked in.
var WrapHost func(h *worker.Host) any
