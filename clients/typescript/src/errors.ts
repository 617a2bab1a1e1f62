// Errors of the Brood wire protocol (docs/protocol.md §2): one class per
// catalogue code, each with its stable string code and number. Branch on the
// class (err instanceof UnauthorizedError) or on err.code, never on the
// message. An error the client made itself (a timeout, no responders, a
// closed connection) carries the underlying error as `cause`.

import type { ErrorBody } from "./protocol.js";

/** The catalogue (§2.2): stable string code → stable number. */
export const Catalogue = {
  INVALID_ARGUMENT: 1001,
  NO_PROVIDER: 1002,
  DUPLICATE_PROVIDER: 1003,
  UNSUPPORTED_CAPABILITY: 1004,
  UNAUTHORIZED: 1005,
  DEPTH_EXCEEDED: 1006,
  UNSUPPORTED_SCHEMA: 1007,
  INVALID_TOOL_FILTER: 1008,
  INVALID_PERSONA: 1009,
  LIMIT_EXCEEDED: 1010,
  DRAINING: 1011,
  DUPLICATE_CHILD: 1012,
  NOT_RESUMABLE: 1013,
  DURABILITY_FAILED: 1014,
  ACTIVATION_CLOSING: 1015,
  PARENT_UNAVAILABLE: 1016,
  ACTIVATION_TEARDOWN_FAILED: 1017,
  CANCELLED: 1018,
  HOST_LOST: 1019,
  NOT_FOUND: 1020,
  UNAVAILABLE: 1021,
  INTERNAL: 1022,
  NOT_PENDING: 1023,
  PERMISSION_DENIED: 1024,
  MODEL_ERROR: 1025,
  TASK_FAILED: 1026,
  AUTHENTICATION_FAILED: 1027,
  ALREADY_ANSWERED: 1028,
  BUDGET_EXHAUSTED: 1029,
} as const;

export type Code = keyof typeof Catalogue;

/**
 * The codes the catalogue marks retryable (§2.2 "retry" yes): trying the same
 * request, or as a run's errorCode the same start, again after a pause may
 * succeed. Every other code is an answer.
 */
export const Retryable: ReadonlySet<Code> = new Set<Code>([
  "DRAINING",
  "DURABILITY_FAILED",
  "ACTIVATION_CLOSING",
  "HOST_LOST",
  "UNAVAILABLE",
  "MODEL_ERROR",
]);

/** isRetryable reports whether a code (an error's or a result's errorCode) is marked retryable. */
export function isRetryable(code: string | undefined): boolean {
  return code !== undefined && Retryable.has(code as Code);
}

/** The base of every Brood error. */
export class BroodError extends Error {
  /** The stable string code, e.g. "NO_PROVIDER". */
  readonly code: string;
  /** The stable number, e.g. 1002 (0 for a code this client does not know). */
  readonly number: number;
  /** The values the message was filled from, plus extra facts. */
  readonly details: Record<string, unknown>;

  constructor(code: string, message: string, details?: Record<string, unknown>, options?: ErrorOptions) {
    super(`${code}: ${message}`, options);
    this.name = new.target.name;
    this.code = code;
    this.number = (Catalogue as Record<string, number>)[code] ?? 0;
    this.details = details ?? {};
  }
}

export class InvalidArgumentError extends BroodError {}
export class NoProviderError extends BroodError {}
export class DuplicateProviderError extends BroodError {}
export class UnsupportedCapabilityError extends BroodError {}
export class UnauthorizedError extends BroodError {}
export class DepthExceededError extends BroodError {}
export class UnsupportedSchemaError extends BroodError {}
export class InvalidToolFilterError extends BroodError {}
export class InvalidPersonaError extends BroodError {}
export class LimitExceededError extends BroodError {}
export class DrainingError extends BroodError {}
export class DuplicateChildError extends BroodError {}
export class NotResumableError extends BroodError {}
export class DurabilityFailedError extends BroodError {}
export class ActivationClosingError extends BroodError {}
export class ParentUnavailableError extends BroodError {}
export class ActivationTeardownFailedError extends BroodError {}
export class CancelledError extends BroodError {}
export class HostLostError extends BroodError {}
export class NotFoundError extends BroodError {}
export class UnavailableError extends BroodError {}
export class InternalError extends BroodError {}
export class NotPendingError extends BroodError {}
export class PermissionDeniedError extends BroodError {}
export class ModelError extends BroodError {}
export class TaskFailedError extends BroodError {}
export class AuthenticationFailedError extends BroodError {}
export class AlreadyAnsweredError extends BroodError {}
/**
 * A budget the session draws on is spent (§5.5 "Budgets"): details budget, limit, unit, value, usage,
 * raises (the ledger's raise count), and for a counted limit needed and remaining.
 */
export class BudgetExhaustedError extends BroodError {}

type ErrorClass = new (code: string, message: string, details?: Record<string, unknown>, options?: ErrorOptions) => BroodError;

/** The class of each catalogue code. */
export const ErrorClasses: Record<Code, ErrorClass> = {
  INVALID_ARGUMENT: InvalidArgumentError,
  NO_PROVIDER: NoProviderError,
  DUPLICATE_PROVIDER: DuplicateProviderError,
  UNSUPPORTED_CAPABILITY: UnsupportedCapabilityError,
  UNAUTHORIZED: UnauthorizedError,
  DEPTH_EXCEEDED: DepthExceededError,
  UNSUPPORTED_SCHEMA: UnsupportedSchemaError,
  INVALID_TOOL_FILTER: InvalidToolFilterError,
  INVALID_PERSONA: InvalidPersonaError,
  LIMIT_EXCEEDED: LimitExceededError,
  DRAINING: DrainingError,
  DUPLICATE_CHILD: DuplicateChildError,
  NOT_RESUMABLE: NotResumableError,
  DURABILITY_FAILED: DurabilityFailedError,
  ACTIVATION_CLOSING: ActivationClosingError,
  PARENT_UNAVAILABLE: ParentUnavailableError,
  ACTIVATION_TEARDOWN_FAILED: ActivationTeardownFailedError,
  CANCELLED: CancelledError,
  HOST_LOST: HostLostError,
  NOT_FOUND: NotFoundError,
  UNAVAILABLE: UnavailableError,
  INTERNAL: InternalError,
  NOT_PENDING: NotPendingError,
  PERMISSION_DENIED: PermissionDeniedError,
  MODEL_ERROR: ModelError,
  TASK_FAILED: TaskFailedError,
  AUTHENTICATION_FAILED: AuthenticationFailedError,
  ALREADY_ANSWERED: AlreadyAnsweredError,
  BUDGET_EXHAUSTED: BudgetExhaustedError,
};

/**
 * brood builds the error of a code: its class when the code is in the
 * catalogue, a plain BroodError for a code this client does not know yet
 * (codes are only ever added, §2.2).
 */
export function brood(code: string, message: string, details?: Record<string, unknown>, cause?: unknown): BroodError {
  const cls = (ErrorClasses as Record<string, ErrorClass>)[code] ?? BroodError;
  return new cls(code, message, details, cause === undefined ? undefined : { cause });
}

/** An error reply's body as an error. */
export function fromBody(body: ErrorBody): BroodError {
  return brood(body.code, body.message, body.details ?? undefined);
}
