package coordinator

// Fair shares (issue 29, item 4; docs/security.md, "Fair shares"). A long
// poll (sessions.log and inbox.read with waitMs) waits up to 60 s, and a
// follow (events.follow) streams for as long as its client sends credit:
// within its request rate, one user could hold every request slot of a
// replica (RequestsInFlightMax) with long polls, and every follow slot
// (FollowsMax) with follows, and the other users' renewals, runs and
// disposes then waited behind them until their roots lapsed. So:
//   - a long poll gives its request slot back while it waits (rpc.Park)
//     and waits in a slot of its own: at most LongPollsMax per replica and
//     UserLongPollsMax per user and replica; one beyond is LIMIT_EXCEEDED
//     (a read without waitMs, a short poll, is never refused here);
//   - follows are at most FollowsMax per replica and UserFollowsMax per
//     user and replica.
// Requests that do work (renewals, starts, disposes, hosts' requests)
// share RequestsInFlightMax with nothing that waits. Anonymous callers
// (<p>.v1.coord.<endpoint>) are bounded per replica only. Both are counted
// by fairshare.Slots (services/coordinator/fairshare).

// Defaults of the fair shares.
const (
	DefaultLongPollsMax     = 1024
	DefaultUserLongPollsMax = 64
	DefaultUserFollowsMax   = 32
)
