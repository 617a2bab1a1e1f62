package coordinator

import (
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/oklog/ulid/v2"

	"github.com/brood-dev/brood/internal/buildinfo"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Config configures a coordinator. Zero values take the defaults of docs/design.md §4.
type Config struct {
	NC    *nats.Conn
	Store *store.Store
	// ID names this replica; default a new ULID.
	ID string
	// HeartbeatInterval: how often this replica's record is rewritten
	// (protocol.DefaultHeartbeatInterval, 1 s).
	HeartbeatInterval time.Duration
	// HostExpiry: a host whose last heartbeat is older is dead
	// (protocol.DefaultHostExpiry, 5 s).
	HostExpiry time.Duration
	// RootLease: how long a root agent lives without agents.renew
	// (DefaultRootLease, 30 s).
	RootLease time.Duration
	// PromptBytesMax bounds a prompt's text (256 KiB).
	PromptBytesMax int
	// LiveChildrenMax bounds the live children of one parent (64).
	LiveChildrenMax int
	// StartQueueMax bounds the runs.start requests that wait in one
	// parent's start queue while it is at LiveChildrenMax
	// (protocol.DefaultStartQueueMax, 1024; startqueue.go; docs/protocol.md
	// §5.5, "The start queue"). Negative: no queue, a start at the limit is
	// refused LIMIT_EXCEEDED.
	StartQueueMax int
	// RequestTimeout is how long a request waits for its answer before it
	// is timed-out, a denial (protocol.RequestTimeout, 5 minutes;
	// requests.go, docs/protocol.md §5.21), unless the asking session's
	// header sets its own (requestTimeoutMs of its start or an ancestor's).
	RequestTimeout time.Duration
	// ProviderAttemptTimeout bounds one attempt of a provider start, prepare
	// or activate at one instance (4 s): an instance that does not answer in
	// time is suspected and the request goes to another live instance
	// (dispatch.go).
	ProviderAttemptTimeout time.Duration
	// RequestBudget is this replica's whole budget for one request whose
	// caller did not send how long it waits (header Brood-Timeout) (20 s):
	// below every client's default timeout (30 s), so a client hears the
	// coordinator's own answer. A request that says how long its caller
	// waits gets that, less replyMargin. Endpoints that wait by design keep
	// their own bounds (ownBound; docs/protocol.md §2.4).
	RequestBudget time.Duration
	// RunAwaitWaitMax caps runs.await's waitMs (60 s).
	RunAwaitWaitMax time.Duration
	// RequestsInFlightMax bounds concurrently handled requests (1024).
	RequestsInFlightMax int
	// StopGrace is how long a stopping replica lets requests in flight
	// finish before it cancels them (5 s); they then answer UNAVAILABLE, so
	// callers retry on another replica.
	StopGrace time.Duration
	// HeadersCachedMax bounds the session header cache (10,000).
	HeadersCachedMax int
	// FollowsMax bounds the follows (events.follow) one replica streams at
	// once (256); more are LIMIT_EXCEEDED.
	FollowsMax int
	// UserFollowsMax bounds the follows of one user on one replica
	// (DefaultUserFollowsMax); more are LIMIT_EXCEEDED (fairshare.go).
	UserFollowsMax int
	// LongPollsMax bounds the long polls (sessions.log and inbox.read
	// with waitMs) one replica holds waiting at once
	// (DefaultLongPollsMax), UserLongPollsMax those of one user
	// (DefaultUserLongPollsMax); more are LIMIT_EXCEEDED. A waiting long
	// poll holds none of the RequestsInFlightMax slots (fairshare.go).
	LongPollsMax, UserLongPollsMax int
	// GrantTTL is how long a user grant lives (24 h); UserGrantsDisabled
	// refuses authority.user altogether.
	GrantTTL           time.Duration
	UserGrantsDisabled bool
	// UserOpenRootsMax bounds the live roots one NATS user holds open at
	// once (DefaultUserOpenRootsMax); agents.open beyond it is
	// LIMIT_EXCEEDED. Only roots opened on a user's own subject count
	// (docs/security.md, quotas.go).
	UserOpenRootsMax int
	// UserRequestsPerSecond and UserRequestsBurst bound the rate of one
	// NATS user's requests to this replica (DefaultUserRequestsPerSecond,
	// DefaultUserRequestsBurst): a token bucket per user; a request over it
	// is LIMIT_EXCEEDED. Anonymous requests (<p>.v1.coord.<endpoint>) are
	// not limited.
	UserRequestsPerSecond float64
	UserRequestsBurst     int
	// UserPromptBytesPerSecond and UserPromptBytesBurst bound the bytes of
	// the prompts (runs.start, continuable.start, followups, reports; the
	// request body, in bytes) one NATS user stores through this replica
	// (DefaultUserPromptBytesPerSecond, DefaultUserPromptBytesBurst): a
	// token bucket per user; a request over it is LIMIT_EXCEEDED (prompt
	// bytes per user) and stores nothing (quotas.go).
	UserPromptBytesPerSecond float64
	UserPromptBytesBurst     int
	// LivenessInterval is how often pending inbox items of sessions with no
	// live activation are looked for and resumed (2 s; docs/design.md §4 asks
	// within 10 s).
	LivenessInterval time.Duration
	// ParkedSweepInterval is how often the request records are looked
	// through for turns parked on a request that no live activation holds,
	// and for pending requests past their deadline; zero or less is
	// DefaultParkedSweepInterval, 10 s (parkedsweep.go).
	ParkedSweepInterval time.Duration
	// BudgetDeadlineSweepInterval is how often the budget ledgers are
	// looked through for deadlines that passed with their subtree not yet
	// ended; zero or less is DefaultBudgetDeadlineSweepInterval, 10 s
	// (deadlines.go).
	BudgetDeadlineSweepInterval time.Duration
	// ContinueWaitMax bounds how long a one-shot run whose host died in
	// the middle of its turn waits, from its takeover, for a live instance
	// of its provider to continue the turn (docs/protocol.md §8.4,
	// "Continued after a host loss"); past it the turn is closed
	// interrupted and the run ends HOST_LOST. Zero is
	// DefaultContinueWaitMax (30 s); negative continues no run (every host
	// loss ends the run HOST_LOST at its takeover).
	ContinueWaitMax time.Duration
	// TakeoversMax bounds the takeovers one run is continued through: the
	// host loss past it ends the run HOST_LOST at its takeover. Zero or
	// less is DefaultTakeoversMax (3).
	TakeoversMax int
	Version      string
	Logger       *slog.Logger
	// Metrics, when set, counts what this replica does (runs it admits or
	// settles, takeovers, followups, requests) and reports the hosts and
	// inbox depth it sees.
	Metrics *telemetry.Metrics
}

func (c *Config) defaults() {
	c.admissionDefaults()
	c.continuationDefaults()
	if c.ID == "" {
		c.ID = ulid.Make().String()
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = protocol.DefaultHeartbeatInterval
	}
	if c.HostExpiry <= 0 {
		c.HostExpiry = protocol.DefaultHostExpiry
	}
	if c.RootLease <= 0 {
		c.RootLease = DefaultRootLease
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = protocol.RequestTimeout
	}
	if c.ProviderAttemptTimeout <= 0 {
		c.ProviderAttemptTimeout = DefaultProviderAttemptTimeout
	}
	if c.RequestBudget <= 0 {
		c.RequestBudget = DefaultRequestBudget
	}
	if c.RunAwaitWaitMax <= 0 {
		c.RunAwaitWaitMax = 60 * time.Second
	}
	if c.RequestsInFlightMax <= 0 {
		c.RequestsInFlightMax = 1024
	}
	if c.StopGrace <= 0 {
		c.StopGrace = 5 * time.Second
	}
	if c.HeadersCachedMax <= 0 {
		c.HeadersCachedMax = 10000
	}
	if c.FollowsMax <= 0 {
		c.FollowsMax = 256
	}
	if c.UserFollowsMax <= 0 {
		c.UserFollowsMax = DefaultUserFollowsMax
	}
	if c.LongPollsMax <= 0 {
		c.LongPollsMax = DefaultLongPollsMax
	}
	if c.UserLongPollsMax <= 0 {
		c.UserLongPollsMax = DefaultUserLongPollsMax
	}
	if c.GrantTTL <= 0 {
		c.GrantTTL = DefaultGrantTTL
	}
	if c.LivenessInterval <= 0 {
		c.LivenessInterval = 2 * time.Second
	}
	if c.Version == "" {
		c.Version = buildinfo.Version
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// admissionDefaults sets the unset admission limits: a prompt's bytes, the
// live children and queued starts per parent, and the per-user quotas.
func (c *Config) admissionDefaults() {
	if c.PromptBytesMax <= 0 {
		c.PromptBytesMax = 256 << 10
	}
	if c.LiveChildrenMax <= 0 {
		c.LiveChildrenMax = 64
	}
	if c.StartQueueMax == 0 {
		c.StartQueueMax = protocol.DefaultStartQueueMax
	}
	if c.UserOpenRootsMax <= 0 {
		c.UserOpenRootsMax = DefaultUserOpenRootsMax
	}
	if c.UserRequestsPerSecond <= 0 {
		c.UserRequestsPerSecond = DefaultUserRequestsPerSecond
	}
	if c.UserRequestsBurst <= 0 {
		c.UserRequestsBurst = DefaultUserRequestsBurst
	}
	if c.UserPromptBytesPerSecond <= 0 {
		c.UserPromptBytesPerSecond = DefaultUserPromptBytesPerSecond
	}
	if c.UserPromptBytesBurst <= 0 {
		c.UserPromptBytesBurst = DefaultUserPromptBytesBurst
	}
}

// continuationDefaults sets the bounds of continuing a run whose host died
// (continue.go).
func (c *Config) continuationDefaults() {
	if c.ContinueWaitMax == 0 {
		c.ContinueWaitMax = DefaultContinueWaitMax
	}
	if c.TakeoversMax <= 0 {
		c.TakeoversMax = DefaultTakeoversMax
	}
}
