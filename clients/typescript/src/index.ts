// @brood-dev/client: the TypeScript client of the Brood coordinator API,
// written from docs/protocol.md.
export * from "./protocol.js";
export * from "./errors.js";
export { Client, Root, Run, encodeBody, decodeBody, errorOf, type ClientOptions, type CallOptions } from "./client.js";
export { Follow, FollowSilenceBeats, FollowRetryWaitMs } from "./follow.js";
