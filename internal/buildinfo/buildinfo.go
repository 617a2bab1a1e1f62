// Package buildinfo holds the one version string of a Brood build: what
// `brood --version` prints and what every micro service (the coordinator and
// each provider: `nats micro ls`) reports. Release builds set it with
// -ldflags "-X github.com/brood-dev/brood/internal/buildinfo.Version=v…";
// micro requires a semantic version.
package buildinfo

// Version is the semantic version of this build.
var Version = "0.1.0"
