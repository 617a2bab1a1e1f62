// Package provider is Brood's provider SDK: what a process needs to serve a
// provider of children (docs/protocol.md §9, "Implementing a provider
// worker"), without writing any of the host framework itself. A Host it
// builds
//
//   - registers: it serves the provider's micro service on
//     `<prefix>.v1.provider.<name>.<op>` and its own host subjects
//     `<prefix>.v1.host.<hostId>.<op>`, and only then writes its host record
//     in brood_hosts, which makes the provider visible to providers.list;
//   - heartbeats: it rewrites that record every HeartbeatInterval (1 s), so a
//     coordinator counts it dead HostExpiry (5 s) after it stops and settles
//     its runs HOST_LOST (docs/protocol.md §9.1, §9.8);
//   - claims: it takes each child's lease in brood_agents with a
//     compare-and-set before it runs a turn, and for a continuable child it
//     claims the turns queued in the child's inbox one at a time
//     (docs/protocol.md §9.3, §9.4);
//   - appends fenced: every record of a child's session log is appended
//     with the expected last sequence of the stream subject, so a host that
//     lost the lease to another can write nothing more (docs/protocol.md
//     §9.6);
//   - settles: it writes the run's final state once, with a compare-and-set
//     on its revision, and notifies the parent (docs/protocol.md §9.7);
//   - drains: when Run's context ends it stops admitting, lets in-flight turns
//     finish within DrainGrace (10 s), disposes what is left, removes its
//     host record and returns nil.
//
// A provider is one of two things:
//
//   - a text provider (NewText): a function that answers a turn with text,
//     given the conversation so far. The host logs the turn (turn/start, the
//     user message, the assistant message, turn/end) exactly as it logs an
//     agent's. The example in examples/echo is a complete provider in a few
//     dozen lines.
//   - a session provider (the Provider interface): the provider composes each
//     child as a Session that logs its own records through SessionSpec.Log,
//     one record per logical step (the ACP bridge, services/acp-bridge, is
//     one: each child is an Agent Client Protocol agent process).
//
// A host serves providers whose log and inbox streams are provisioned:
// `brood provision --providers spawn,fork,acp,NAME` (services/dev.Config
// Providers in a test). In a deployment with users, the host's NATS user is
// the worker user of that provider (docs/security.md "Workers scoped to their
// provider").
//
// The session contract (Provider, Session, ContinuableSession, SessionSpec,
// Input, Outcome, Appender, Inbox, ...) is declared in
// pkg/provider/contract, a leaf on nothing of Brood's but pkg/protocol, and
// named here by aliases: the host framework inside the module drives those
// very types, so no name of this package's API is one a program outside the
// module cannot import.
//
// The in-repo providers spawn and fork (services/spawn-worker,
// services/fork-worker) are Brood agents on a model, and the ACP bridge
// (services/acp-bridge) a session provider; they reach the host framework
// only through this package's Host, as a third party does. What they hand
// it is the module's own (its opened store, its metrics, the agent runtime):
// they build their hosts with internal/providerhost, the module's door to
// the same Host, which this package's public API does not offer.
package provider
