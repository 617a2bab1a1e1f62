package protocol

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Code is a stable string error code, the client contract together with its
// numeric code (see Catalogue). Codes never change meaning once published.
type Code string

// The error catalogue (docs/design.md §3). The seed's and upstream's codes
// (docs/upstream-behaviour.md §1.1) keep their names; Brood adds codes for what
// upstream left uncoded (docs/upstream-behaviour.md §1.2).
const (
	CodeInvalidArgument          Code = "INVALID_ARGUMENT"
	CodeNoProvider               Code = "NO_PROVIDER"
	CodeDuplicateProvider        Code = "DUPLICATE_PROVIDER"
	CodeUnsupportedCapability    Code = "UNSUPPORTED_CAPABILITY"
	CodeUnauthorized             Code = "UNAUTHORIZED"
	CodeDepthExceeded            Code = "DEPTH_EXCEEDED"
	CodeUnsupportedSchema        Code = "UNSUPPORTED_SCHEMA"
	CodeInvalidToolFilter        Code = "INVALID_TOOL_FILTER"
	CodeInvalidPersona           Code = "INVALID_PERSONA"
	CodeLimitExceeded            Code = "LIMIT_EXCEEDED"
	CodeDraining                 Code = "DRAINING"
	CodeDuplicateChild           Code = "DUPLICATE_CHILD"
	CodeNotResumable             Code = "NOT_RESUMABLE"
	CodeDurabilityFailed         Code = "DURABILITY_FAILED"
	CodeActivationClosing        Code = "ACTIVATION_CLOSING"
	CodeParentUnavailable        Code = "PARENT_UNAVAILABLE"
	CodeActivationTeardownFailed Code = "ACTIVATION_TEARDOWN_FAILED"
	CodeCancelled                Code = "CANCELLED"
	CodeHostLost                 Code = "HOST_LOST"
	CodeNotFound                 Code = "NOT_FOUND"
	CodeUnavailable              Code = "UNAVAILABLE"
	CodeInternal                 Code = "INTERNAL"
	CodeNotPending               Code = "NOT_PENDING"
	// CodePermissionDenied is made by a client or service itself when NATS
	// refused its connection's user a publish or subscription (a
	// permissions violation): the role it acts in lacks the right
	// (docs/security.md). No coordinator answers it.
	CodePermissionDenied Code = "PERMISSION_DENIED"
	// CodeModelError is a run's (or turn's) errorCode when the model call
	// failed: an outage, a refused or malformed model request (issue 37,
	// item 2). No coordinator answers it to a request.
	CodeModelError Code = "MODEL_ERROR"
	// CodeTaskFailed is a run's errorCode when the child's turn ended but
	// did not do what the start asked of it: a requested outputSchema was
	// never satisfied.
	CodeTaskFailed Code = "TASK_FAILED"
	// CodeAuthenticationFailed is made by a client or service itself when
	// NATS refused its connection's credentials (a wrong user, password,
	// token or creds file). No coordinator answers it.
	CodeAuthenticationFailed Code = "AUTHENTICATION_FAILED"
	// CodeAlreadyAnswered answers a second answer to a request (approval):
	// the first answer, or its timeout, decided it (docs/protocol.md §5.21).
	CodeAlreadyAnswered Code = "ALREADY_ANSWERED"
	// CodeBudgetExhausted is a run's errorCode, and budget.reserve's
	// answer, when a budget the session draws on is spent: its tokens,
	// model requests, tool calls or children, or its deadline passed
	// (docs/protocol.md §5.5, "Budgets"). Details: budget (the session
	// that named it), limit, unit, value (the limit), usage (charged and
	// reserved against it).
	CodeBudgetExhausted Code = "BUDGET_EXHAUSTED"
)

// CatalogueEntry describes one error code: its stable numeric code (sent in
// the Nats-Service-Error-Code header) and its message template. Placeholders
// `{name}` in Template are filled from the error's Details; Hint says what to
// do about it and is appended to every message. Retryable marks a code a
// client or scheduler may act on by trying again after a pause: the same
// request (or, as a run's errorCode, the same start) may succeed later
// (docs/protocol.md §2.3); every other code is an answer.
type CatalogueEntry struct {
	Code      Code
	Number    int
	Retryable bool
	Template  string
	Hint      string
}

// Catalogue lists every error code Brood answers with. Numeric codes are
// stable and unique; docs/protocol.md reproduces this table.
var Catalogue = []CatalogueEntry{
	{CodeInvalidArgument, 1001, false, "{reason}", "fix the request; it was not acted on"},
	{CodeNoProvider, 1002, false, "no provider named \"{provider}\" is registered", "list live providers with `brood providers` or start a worker for it"},
	{CodeDuplicateProvider, 1003, false, "provider \"{provider}\" is already registered with a different descriptor", "give this instance the same descriptor as the live instances, or a different provider name"},
	{CodeUnsupportedCapability, 1004, false, "provider \"{provider}\" does not support {capability}", "drop the option or choose a provider whose descriptor has the capability"},
	{CodeUnauthorized, 1005, false, "not authorized: {reason}", "act as the exact live parent agent (its current credential) or with a user grant"},
	{CodeDepthExceeded, 1006, false, "delegation depth {attemptedDepth} exceeds the maximum depth {maxDepth}", "do the work in this agent instead of delegating deeper"},
	{CodeUnsupportedSchema, 1007, false, "outputSchema is outside the supported subset: {violations}", "use an object-rooted schema built from type, properties, required, additionalProperties, items, enum, const and oneOf"},
	{CodeInvalidToolFilter, 1008, false, "invalid tool filter: {reason}", "name at least one of allow/deny and only tools the provider offers and the parent may use"},
	{CodeInvalidPersona, 1009, false, "invalid persona template: {reason}", "use only {{provider}}, {{model}} and {{cwd}} references"},
	{CodeLimitExceeded, 1010, false, "{limit} exceeded: {reason}", "send less or split the work; nothing was truncated"},
	{CodeDraining, 1011, true, "admission is closed: {reason}", "nothing was created; start it once the drain is lifted, or in a lineage no drain holds"},
	{CodeDuplicateChild, 1012, false, "child id \"{childId}\" was already used", "choose a new child id or omit it"},
	{CodeNotResumable, 1013, false, "session {childId} cannot be resumed: {reason}", "nothing was delivered"},
	{CodeDurabilityFailed, 1014, true, "JetStream did not acknowledge the session's writes: {reason}", "check the JetStream servers; the durable record is reconciled once writes are accepted again"},
	{CodeActivationClosing, 1015, true, "the activation is closing: {reason}", "retry once the activation settled"},
	{CodeParentUnavailable, 1016, false, "the parent is not available: {reason}", "the parent is no longer live; nothing was delivered"},
	{CodeActivationTeardownFailed, 1017, false, "activation teardown failed: {reason}", "see the diagnostic; durable sessions are unaffected"},
	{CodeCancelled, 1018, false, "cancelled: {reason}", "the caller cancelled the operation"},
	{CodeHostLost, 1019, true, "host {hostId} stopped heartbeating", "the run was settled by a coordinator; start a new run"},
	{CodeNotFound, 1020, false, "{what} not found", "check the id"},
	{CodeUnavailable, 1021, true, "{reason}", "retry later, or check that the coordinator, the workers and JetStream are running"},
	{CodeInternal, 1022, false, "internal error: {reason}", "report this with the logs; the request may not have been completed"},
	{CodeNotPending, 1023, false, "run {runId} is no longer waiting to start: {reason}", "another instance started it, or its requester gave up; nothing was done"},
	{CodePermissionDenied, 1024, false, "permission denied: {reason}", "connect as a NATS user of the role this needs (docs/security.md lists each role and its rights); nothing was done"},
	{CodeModelError, 1025, true, "the model failed: {reason}", "a model outage or a model request it refused; retry later, and check the worker's model settings if it persists"},
	{CodeTaskFailed, 1026, false, "the child did not do its task: {reason}", "the run ended without the result its start asked for; change the prompt or the schema before starting it again"},
	{CodeAuthenticationFailed, 1027, false, "NATS refused the connection's credentials: {reason}", "check the NATS user and password (the URL, BROOD_NATS_USER and BROOD_NATS_PASSWORD); retrying with the same credentials gets the same answer"},
	{CodeAlreadyAnswered, 1028, false, "request {requestId} was already answered: it is {state}", "the first answer decided it (a timeout counts as a denial); nothing was changed"},
	{CodeBudgetExhausted, 1029, false, "the budget of {budget} is spent: its {limit} limit of {value} {unit} is reached ({usage} used)", "nothing more was started; raise the budget or start the work with a larger one"},
}

var catalogueByCode = func() map[Code]CatalogueEntry {
	m := make(map[Code]CatalogueEntry, len(Catalogue))
	for _, e := range Catalogue {
		m[e.Code] = e
	}
	return m
}()

// Lookup returns the catalogue entry of code; ok is false for an unknown code.
func Lookup(code Code) (CatalogueEntry, bool) {
	e, ok := catalogueByCode[code]
	return e, ok
}

// Number returns the stable numeric code of code, or 0 when unknown.
func (c Code) Number() int { return catalogueByCode[c].Number }

// Retryable reports whether the catalogue marks code retryable (false when
// unknown): trying the same request, or the same start, again after a pause
// may succeed (docs/protocol.md §2.2, §2.3).
func (c Code) Retryable() bool { return catalogueByCode[c].Retryable }

// Error is the one error type of the wire contract. On the wire it travels as
// the body {code, message, details?} plus the micro headers
// Nats-Service-Error-Code (numeric) and Nats-Service-Error ("CODE: message").
// Errors match with errors.Is by Code only, so
// errors.Is(err, protocol.ErrNoProvider) holds for any NO_PROVIDER error.
// Cause, never sent on the wire, is the local error behind it (a timeout, a
// cancelled context, a lost connection, a refused JetStream write): Errorf
// records what it was given with %w, and Unwrap returns it, so
// errors.Is(err, context.DeadlineExceeded) holds as well.
type Error struct {
	Code    Code           `msgpack:"code" json:"code"`
	Message string         `msgpack:"message" json:"message"`
	Details map[string]any `msgpack:"details,omitempty" json:"details,omitempty"`
	Cause   error          `msgpack:"-" json:"-"`
}

// Unwrap returns the local cause, if any.
func (e *Error) Unwrap() error { return e.Cause }

// WithCause returns e with cause recorded (e itself, for chaining).
func (e *Error) WithCause(cause error) *Error {
	e.Cause = cause
	return e
}

func (e *Error) Error() string {
	if e.Message == "" {
		return string(e.Code)
	}
	return string(e.Code) + ": " + e.Message
}

// Is reports whether target is a *Error with the same Code.
func (e *Error) Is(target error) bool {
	var t *Error
	if !errors.As(target, &t) {
		return false
	}
	return t.Code == e.Code
}

// NewError builds an error of code whose message is the catalogue template
// filled from details, followed by the catalogue hint. Unknown placeholders
// are left as `{name}` so a missing detail is visible, never silent.
func NewError(code Code, details map[string]any) *Error {
	entry, ok := catalogueByCode[code]
	if !ok {
		entry = CatalogueEntry{Code: code, Template: string(code)}
	}
	msg := fill(entry.Template, details)
	if entry.Hint != "" {
		msg += "; " + entry.Hint
	}
	return &Error{Code: code, Message: msg, Details: details}
}

// Errorf is NewError for the common case of one `reason` detail, formatted
// as fmt.Errorf formats: an error given with %w becomes the Cause (several
// %w: all of them), so errors.Is and errors.As reach it, while the wire
// carries only its text.
func Errorf(code Code, format string, args ...any) *Error {
	reason := fmt.Errorf(format, args...)
	e := NewError(code, map[string]any{"reason": reason.Error()})
	switch w := reason.(type) {
	case interface{ Unwrap() error }:
		e.Cause = w.Unwrap()
	case interface{ Unwrap() []error }:
		e.Cause = reason
	}
	return e
}

// AsError returns err as a *Error: itself when it is one (or wraps one), else
// an INTERNAL error carrying err's text.
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return Errorf(CodeInternal, "%w", err)
}

// CodeOf returns the Code of err, or "" when err carries none.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func fill(tmpl string, details map[string]any) string {
	if len(details) == 0 || !strings.Contains(tmpl, "{") {
		return tmpl
	}
	keys := make([]string, 0, len(details))
	for k := range details {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	pairs := make([]string, 0, 2*len(keys))
	for _, k := range keys {
		pairs = append(pairs, "{"+k+"}", detailString(details[k]))
	}
	return strings.NewReplacer(pairs...).Replace(tmpl)
}

func detailString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []string:
		return strings.Join(x, "; ")
	case []any:
		parts := make([]string, len(x))
		for i, p := range x {
			parts[i] = fmt.Sprint(p)
		}
		return strings.Join(parts, "; ")
	default:
		return fmt.Sprint(x)
	}
}

// Sentinels for errors.Is. They carry only a Code.
var (
	ErrInvalidArgument          = &Error{Code: CodeInvalidArgument}
	ErrNoProvider               = &Error{Code: CodeNoProvider}
	ErrDuplicateProvider        = &Error{Code: CodeDuplicateProvider}
	ErrUnsupportedCapability    = &Error{Code: CodeUnsupportedCapability}
	ErrUnauthorized             = &Error{Code: CodeUnauthorized}
	ErrDepthExceeded            = &Error{Code: CodeDepthExceeded}
	ErrUnsupportedSchema        = &Error{Code: CodeUnsupportedSchema}
	ErrInvalidToolFilter        = &Error{Code: CodeInvalidToolFilter}
	ErrInvalidPersona           = &Error{Code: CodeInvalidPersona}
	ErrLimitExceeded            = &Error{Code: CodeLimitExceeded}
	ErrDraining                 = &Error{Code: CodeDraining}
	ErrDuplicateChild           = &Error{Code: CodeDuplicateChild}
	ErrNotResumable             = &Error{Code: CodeNotResumable}
	ErrDurabilityFailed         = &Error{Code: CodeDurabilityFailed}
	ErrActivationClosing        = &Error{Code: CodeActivationClosing}
	ErrParentUnavailable        = &Error{Code: CodeParentUnavailable}
	ErrActivationTeardownFailed = &Error{Code: CodeActivationTeardownFailed}
	ErrCancelled                = &Error{Code: CodeCancelled}
	ErrHostLost                 = &Error{Code: CodeHostLost}
	ErrNotFound                 = &Error{Code: CodeNotFound}
	ErrUnavailable              = &Error{Code: CodeUnavailable}
	ErrInternal                 = &Error{Code: CodeInternal}
	ErrNotPending               = &Error{Code: CodeNotPending}
	ErrPermissionDenied         = &Error{Code: CodePermissionDenied}
	ErrModelError               = &Error{Code: CodeModelError}
	ErrTaskFailed               = &Error{Code: CodeTaskFailed}
	ErrAuthenticationFailed     = &Error{Code: CodeAuthenticationFailed}
	ErrAlreadyAnswered          = &Error{Code: CodeAlreadyAnswered}
	ErrBudgetExhausted          = &Error{Code: CodeBudgetExhausted}
)
