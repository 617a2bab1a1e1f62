package model

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/shared"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Defaults of the openai adapter (docs/design.md §5: DeepSeek unless configured
// otherwise).
const (
	DefaultOpenAIBaseURL = "https://api.deepseek.com"
	DefaultOpenAIModel   = "deepseek-chat"

	openAIStreamIdleTimeoutDefault = 60 * time.Second
	openAIRequestTimeoutDefault    = 10 * time.Minute

	// openAIToolCallsMax bounds the tool-call index a stream may use and the
	// calls of one answer, so a broken server cannot make the adapter track
	// an unbounded set of calls.
	openAIToolCallsMax = 128
	// openAIErrorBodyBytesMax bounds how much of an HTTP error body is read.
	openAIErrorBodyBytesMax = 4096
	// diagnosticBytesMax bounds a model.Error diagnostic.
	diagnosticBytesMax = 300
	// retryAfterMax bounds a parsed Retry-After, so a huge value cannot
	// overflow a duration; the runtime's own cap is lower
	// (agent.Limits.ModelRetryAfterMax).
	retryAfterMax = time.Hour
)

// Environment variables read by OpenAIConfigFromEnv.
const (
	EnvModelBaseURL = "BROOD_MODEL_BASE_URL"
	EnvModelName    = "BROOD_MODEL_NAME"
	EnvDeepSeekKey  = "DEEPSEEK_API_KEY"
	EnvOpenAIKey    = "OPENAI_API_KEY"
)

// OpenAIConfig configures the openai adapter. Zero values take the defaults
// given per field; NewOpenAI validates it.
type OpenAIConfig struct {
	// BaseURL is the endpoint root that "chat/completions" is appended to,
	// e.g. "https://api.deepseek.com" or "https://api.openai.com/v1".
	// Required: http or https with a host.
	BaseURL string
	// Model is the model id sent with every request ("deepseek-chat"). Required.
	Model string
	// APIKey is sent as a bearer token. Required: without it nothing is ever
	// called. It never appears in a diagnostic.
	APIKey string
	// MaxTokens is sent as max_tokens when a Request leaves MaxTokens 0;
	// 0 here leaves it to the endpoint.
	MaxTokens int64
	// StreamIdleTimeout ends an attempt that received no bytes for this long
	// (waiting for headers included; SSE keep-alive comments count as bytes)
	// with a model error. 0 (or negative) means 60s.
	StreamIdleTimeout time.Duration
	// RequestTimeout bounds one attempt from sending to the last byte of the
	// stream. 0 means 10m; negative means no bound beyond ctx and the idle
	// timeout.
	RequestTimeout time.Duration
	// HTTPClient sends the requests; nil means a fresh client on
	// http.DefaultTransport. Its own Timeout, if any, also applies.
	HTTPClient *http.Client
}

// OpenAIConfigFromEnv reads the endpoint from the environment: BaseURL from
// BROOD_MODEL_BASE_URL (default DefaultOpenAIBaseURL), Model from
// BROOD_MODEL_NAME (default DefaultOpenAIModel), APIKey from DEEPSEEK_API_KEY,
// else OPENAI_API_KEY (empty when neither is set, which NewOpenAI refuses).
// Other fields are left zero, i.e. at their defaults.
func OpenAIConfigFromEnv() OpenAIConfig {
	cfg := OpenAIConfig{
		BaseURL: os.Getenv(EnvModelBaseURL),
		Model:   os.Getenv(EnvModelName),
		APIKey:  os.Getenv(EnvDeepSeekKey),
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultOpenAIBaseURL
	}
	if cfg.Model == "" {
		cfg.Model = DefaultOpenAIModel
	}
	if cfg.APIKey == "" {
		cfg.APIKey = os.Getenv(EnvOpenAIKey)
	}
	return cfg
}

// OpenAI is the adapter for any OpenAI-compatible chat-completions endpoint
// (docs/design.md §5), built on github.com/openai/openai-go/v3. Each Stream call is
// one streamed chat completion, one attempt: retries are the runtime's
// (internal/agent); an OpenAI value holds no per-call state and is safe for
// concurrent use.
//
// DeepSeek's reasoning_content is read from every delta and sent back on
// assistant messages exactly as received: nil stays absent, "" is sent as "".
type OpenAI struct {
	cfg  OpenAIConfig // defaults applied
	base string       // BaseURL with any password masked, for diagnostics
	svc  openai.ChatCompletionService
}

// NewOpenAI validates cfg, applies its defaults and returns the adapter. It
// returns an error when the API key or the model is empty or BaseURL is not an
// http(s) URL with a host. It makes no request.
func NewOpenAI(cfg OpenAIConfig) (*OpenAI, error) {
	if cfg.APIKey == "" {
		return nil, fmt.Errorf("openai model: no API key: set %s or %s", EnvDeepSeekKey, EnvOpenAIKey)
	}
	if cfg.Model == "" {
		return nil, fmt.Errorf("openai model: no model name: set %s (for example %q)", EnvModelName, DefaultOpenAIModel)
	}
	u, err := url.Parse(cfg.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("openai model: base URL %q is not an http(s) URL with a host: set %s (for example %q)",
			cfg.BaseURL, EnvModelBaseURL, DefaultOpenAIBaseURL)
	}
	if cfg.StreamIdleTimeout <= 0 {
		cfg.StreamIdleTimeout = openAIStreamIdleTimeoutDefault
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = openAIRequestTimeoutDefault
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	// NewChatCompletionService, unlike openai.NewClient, reads no OPENAI_*
	// environment (organisation, project, custom headers), so nothing ambient
	// leaks to a non-OpenAI endpoint. Retries are ours (see Stream).
	svc := openai.NewChatCompletionService(
		option.WithBaseURL(cfg.BaseURL),
		option.WithAPIKey(cfg.APIKey),
		option.WithHTTPClient(cfg.HTTPClient),
		option.WithMaxRetries(0),
	)
	return &OpenAI{cfg: cfg, base: u.Redacted(), svc: svc}, nil
}

// Provider returns "openai".
func (*OpenAI) Provider() string { return "openai" }

// Name returns the configured model id.
func (o *OpenAI) Name() string { return o.cfg.Model }

// Stream sends req as one streamed chat completion and calls onText with each
// non-empty text delta. Mapping: System becomes a leading system message (when
// non-empty); every message keeps its role, and its content is the text of
// all its blocks, framing included, joined with "\n"; assistant messages carry
// their tool calls (arguments byte for byte) and reasoning_content; tool
// messages carry tool_call_id; Tools become function tools whose parameters
// are the raw JSON Schema; MaxTokens (else the configured one) is sent as
// max_tokens; usage is requested with stream_options.include_usage.
//
// The answer: text deltas joined; reasoning_content deltas joined (nil when no
// delta carried one, "" when they were all empty); tool calls assembled by
// their index, in index order, with arguments exactly as streamed; a fragment
// continues the latest call at its index unless it names a different id
// (some servers give every call index 0), so two calls are never merged; a
// refusal as an extra text block. Finish: a refusal or "content_filter" is
// FinishRefusal, "length" FinishLength (even with tool calls, whose arguments
// are then cut), otherwise FinishToolCalls whenever tool calls are present,
// else "stop" is FinishStop. Usage is set when the stream sent it.
//
// Failures are a *Error with a short diagnostic such as
// "HTTP 401 from https://api.deepseek.com: invalid api key" (no payloads, no
// key, at most 300 bytes), its HTTP status and Retry-After. It is Retryable
// (see Error) when nothing of the answer arrived and the failure is
// temporary: HTTP 408, 429 or 5xx; a transport failure (a connection reset
// or refused, an EOF, a network timeout; not an unknown host or a
// certificate that does not verify); the idle or request timeout; a stream
// that ended without a finish reason or with a finish reason Brood does not
// know (DeepSeek's "insufficient_system_resource"). Never Retryable: other
// HTTP errors (400, 401, 403, 404, ...), an error event in the stream, a
// malformed chunk. When ctx is cancelled Stream returns ctx.Err(); the text
// already passed to onText is the partial answer.
func (o *OpenAI) Stream(ctx context.Context, req Request, onText func(string)) (Response, error) {
	params, err := o.params(req)
	if err != nil {
		return Response{}, err
	}
	resp, f := o.attempt(ctx, params, onText)
	if ctx.Err() != nil {
		return Response{}, ctx.Err()
	}
	if f != nil {
		return Response{}, &Error{Diagnostic: o.clean(f.diag), Retryable: f.temporary && !f.content,
			Status: f.status, RetryAfter: f.retryAfter}
	}
	return resp, nil
}

// failure is why one attempt failed.
type failure struct {
	diag       string
	temporary  bool          // the same request may succeed later
	content    bool          // part of the answer had arrived
	status     int           // the HTTP status, 0 when none
	retryAfter time.Duration // server's Retry-After, 0 when absent
}

var (
	errStreamIdle     = errors.New("stream idle")
	errRequestTimeout = errors.New("request timeout")
)

// httpResult is what the middleware saw of one attempt's HTTP response.
type httpResult struct {
	status     int
	body       []byte // first bytes of an error body
	retryAfter time.Duration
}

// attempt runs one request and reads its stream to the end. The idle timer is
// re-armed by every byte read from the body, so it measures silence on the
// wire, not gaps between chunks.
func (o *OpenAI) attempt(ctx context.Context, params openai.ChatCompletionNewParams, onText func(string)) (Response, *failure) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if o.cfg.RequestTimeout > 0 {
		var stop context.CancelFunc
		actx, stop = context.WithTimeoutCause(actx, o.cfg.RequestTimeout, errRequestTimeout)
		defer stop()
	}
	idle := time.AfterFunc(o.cfg.StreamIdleTimeout, func() { cancel(errStreamIdle) })
	defer idle.Stop()
	touch := func() { idle.Reset(o.cfg.StreamIdleTimeout) }

	var hr httpResult
	mw := func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		res, err := next(r)
		if err != nil || res == nil {
			return res, err
		}
		touch()
		hr.status = res.StatusCode
		if res.StatusCode >= 400 {
			hr.retryAfter = parseRetryAfter(res.Header.Get("Retry-After"))
			hr.body, _ = io.ReadAll(io.LimitReader(res.Body, openAIErrorBodyBytesMax))
			_ = res.Body.Close()
			res.Body = io.NopCloser(strings.NewReader(string(hr.body)))
			return res, nil
		}
		res.Body = &activityBody{ReadCloser: res.Body, touch: touch}
		return res, nil
	}

	stream := o.svc.NewStreaming(actx, params, option.WithMiddleware(mw))
	defer stream.Close()
	var acc streamAcc
	for stream.Next() {
		if f := acc.add(stream.Current(), onText); f != nil {
			return Response{}, f
		}
	}
	if err := stream.Err(); err != nil {
		return Response{}, o.classify(actx, err, hr, acc.content)
	}
	if cause := context.Cause(actx); cause != nil {
		// The body may end cleanly right when a timer fires.
		return Response{}, o.classify(actx, cause, hr, acc.content)
	}
	resp, f := acc.response()
	if f != nil {
		f.content = acc.content
	}
	return resp, f
}

// classify turns an attempt's error into a failure. Timers and HTTP statuses
// come first because the library's error then only says the read was cut.
func (o *OpenAI) classify(actx context.Context, err error, hr httpResult, content bool) *failure {
	switch cause := context.Cause(actx); {
	case errors.Is(cause, errStreamIdle):
		return &failure{diag: fmt.Sprintf("no data from %s for %s", o.base, o.cfg.StreamIdleTimeout), temporary: true, content: content}
	case errors.Is(cause, errRequestTimeout):
		return &failure{diag: fmt.Sprintf("request to %s took longer than %s", o.base, o.cfg.RequestTimeout), temporary: true, content: content}
	}
	if hr.status >= 400 {
		return &failure{
			diag:       fmt.Sprintf("HTTP %d from %s: %s", hr.status, o.base, errorBodyMessage(hr.body, hr.status)),
			temporary:  temporaryStatus(hr.status),
			content:    content,
			status:     hr.status,
			retryAfter: hr.retryAfter,
		}
	}
	var se *ssestream.StreamError
	if errors.As(err, &se) {
		return &failure{diag: fmt.Sprintf("error event in stream from %s: %s", o.base, errorBodyMessage(se.Event.Data, 0)), content: content}
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	if errors.As(err, &syn) || errors.As(err, &typ) {
		return &failure{diag: fmt.Sprintf("malformed stream from %s: %v", o.base, err), content: content}
	}
	return &failure{diag: fmt.Sprintf("request to %s failed: %v", o.base, err), temporary: temporaryTransport(err), content: content}
}

// temporaryStatus reports whether an HTTP status may clear by itself: 408
// (request timeout), 429 (rate limit) and 5xx (an outage, an overload).
func temporaryStatus(status int) bool {
	return status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || status >= 500
}

// temporaryTransport reports whether a transport failure may clear by
// itself: a connection reset, refused or cut (EOF), a network timeout. An
// unknown host and a certificate that does not verify are configuration
// errors that no retry fixes.
func temporaryTransport(err error) bool {
	var dns *net.DNSError
	var cert *tls.CertificateVerificationError
	var unknownAuthority x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, &dns) && dns.IsNotFound,
		errors.As(err, &cert), errors.As(err, &unknownAuthority), errors.As(err, &hostname), errors.As(err, &invalid):
		return false
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNABORTED),
		errors.Is(err, syscall.EPIPE):
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op)
}

// params maps a Request onto the library's request body.
func (o *OpenAI) params(req Request) (openai.ChatCompletionNewParams, error) {
	p := openai.ChatCompletionNewParams{
		Model:         shared.ChatModel(o.cfg.Model),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	if req.System != "" {
		p.Messages = append(p.Messages, openai.SystemMessage(req.System))
	}
	for i, m := range req.Messages {
		text := protocol.AllText(m.Content)
		switch m.Role {
		case RoleUser:
			p.Messages = append(p.Messages, openai.UserMessage(text))
		case RoleTool:
			p.Messages = append(p.Messages, openai.ToolMessage(text, m.ToolCallID))
		case RoleAssistant:
			p.Messages = append(p.Messages, openai.ChatCompletionMessageParamUnion{OfAssistant: assistantParam(m, text)})
		default:
			return p, &Error{Diagnostic: fmt.Sprintf("openai: message %d has unknown role %q", i, m.Role)}
		}
	}
	for _, t := range req.Tools {
		fd := shared.FunctionDefinitionParam{Name: t.Name}
		if t.Description != "" {
			fd.Description = openai.String(t.Description)
		}
		if len(t.Parameters) > 0 {
			if !json.Valid(t.Parameters) {
				return p, &Error{Diagnostic: fmt.Sprintf("openai: tool %q parameters are not valid JSON", t.Name)}
			}
			// An extra field keeps the schema as written (key order,
			// number text); FunctionParameters is a map[string]any.
			fd.SetExtraFields(map[string]any{"parameters": t.Parameters})
		}
		p.Tools = append(p.Tools, openai.ChatCompletionFunctionTool(fd))
	}
	if n := req.MaxTokens; n > 0 {
		p.MaxTokens = openai.Int(n)
	} else if o.cfg.MaxTokens > 0 {
		p.MaxTokens = openai.Int(o.cfg.MaxTokens)
	}
	return p, nil
}

// assistantParam builds an assistant message. Content is omitted only when it
// is empty and tool calls carry the message, the shape every endpoint takes.
// reasoning_content goes in as an extra field: the library has no such field,
// and its extra-field encoder writes "" as "" (it never drops an empty value).
func assistantParam(m Message, text string) *openai.ChatCompletionAssistantMessageParam {
	a := &openai.ChatCompletionAssistantMessageParam{}
	if text != "" || len(m.ToolCalls) == 0 {
		a.Content.OfString = openai.String(text)
	}
	for _, c := range m.ToolCalls {
		a.ToolCalls = append(a.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
			OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
				ID:       c.ID,
				Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.Name, Arguments: c.Arguments},
			},
		})
	}
	if m.ReasoningContent != nil {
		a.SetExtraFields(map[string]any{"reasoning_content": *m.ReasoningContent})
	}
	return a
}

// streamAcc assembles one streamed answer (choice 0).
type streamAcc struct {
	text      strings.Builder
	refusal   strings.Builder
	reasoning strings.Builder
	reasoned  bool // a delta carried reasoning_content (possibly "")
	calls     []indexedCall
	finish    string
	usage     *protocol.Usage
	content   bool // anything of the answer arrived (a retry would repeat it)
}

type indexedCall struct {
	index int64
	call  protocol.ToolCall
}

// add folds one chunk in. Tool-call ids and names arrive on the first
// fragment of a call, arguments in fragments; several calls may share a chunk.
func (a *streamAcc) add(c openai.ChatCompletionChunk, onText func(string)) *failure {
	if c.JSON.Usage.Valid() {
		a.usage = &protocol.Usage{InputTokens: c.Usage.PromptTokens, OutputTokens: c.Usage.CompletionTokens}
	}
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue // n is never set, so only choice 0 exists
		}
		d := ch.Delta
		if d.Content != "" {
			a.content = true
			a.text.WriteString(d.Content)
			onText(d.Content)
		}
		if d.Refusal != "" {
			a.content = true
			a.refusal.WriteString(d.Refusal)
		}
		// Extra fields are never Valid() (the library has no type for them);
		// Raw() is "" when absent, "null" when null, else the JSON value.
		if raw := d.JSON.ExtraFields["reasoning_content"].Raw(); raw != "" && raw != "null" {
			var s string
			if err := json.Unmarshal([]byte(raw), &s); err != nil {
				return &failure{diag: "malformed stream: reasoning_content is not a string"}
			}
			a.content, a.reasoned = true, true
			a.reasoning.WriteString(s)
		}
		for _, tc := range d.ToolCalls {
			if f := a.addCall(tc); f != nil {
				return f
			}
		}
		if ch.FinishReason != "" {
			a.finish = ch.FinishReason
		}
	}
	return nil
}

func (a *streamAcc) addCall(tc openai.ChatCompletionChunkChoiceDeltaToolCall) *failure {
	a.content = true
	idx := tc.Index
	if !tc.JSON.Index.Valid() {
		// Some servers omit the index: a new id starts a new call,
		// anything else continues the last one.
		switch n := len(a.calls); {
		case n == 0:
			idx = 0
		case tc.ID != "" && tc.ID != a.calls[n-1].call.ID:
			idx = a.calls[n-1].index + 1
		default:
			idx = a.calls[n-1].index
		}
	}
	if idx < 0 || idx >= openAIToolCallsMax {
		return &failure{diag: fmt.Sprintf("malformed stream: tool call index %d outside 0..%d", idx, openAIToolCallsMax-1)}
	}
	// A fragment continues the latest call at its index, unless it names a
	// different id: some servers give every call of a message index 0, so a
	// new id at a used index starts a new call rather than merging two.
	var c *protocol.ToolCall
	for i := len(a.calls) - 1; i >= 0; i-- {
		if a.calls[i].index == idx {
			if tc.ID == "" || a.calls[i].call.ID == "" || a.calls[i].call.ID == tc.ID {
				c = &a.calls[i].call
			}
			break
		}
	}
	if c == nil {
		if len(a.calls) >= openAIToolCallsMax {
			return &failure{diag: fmt.Sprintf("malformed stream: more than %d tool calls in one answer", openAIToolCallsMax)}
		}
		a.calls = append(a.calls, indexedCall{index: idx})
		c = &a.calls[len(a.calls)-1].call
	}
	if c.ID == "" {
		c.ID = tc.ID
	}
	if c.Name == "" {
		c.Name = tc.Function.Name
	}
	c.Arguments += tc.Function.Arguments
	return nil
}

// response builds the answer once the stream ended cleanly.
func (a *streamAcc) response() (Response, *failure) {
	msg := protocol.AssistantMessage{Content: protocol.Text(a.text.String())}
	if a.refusal.Len() > 0 {
		msg.Content = append(msg.Content, protocol.ContentBlock{Type: protocol.BlockText, Text: a.refusal.String()})
	}
	if a.reasoned {
		r := a.reasoning.String()
		msg.ReasoningContent = &r
	}
	sort.SliceStable(a.calls, func(i, j int) bool { return a.calls[i].index < a.calls[j].index })
	for _, c := range a.calls {
		if c.call.ID == "" || c.call.Name == "" {
			return Response{}, &failure{diag: fmt.Sprintf("malformed stream: tool call at index %d has no id or no name", c.index)}
		}
		msg.ToolCalls = append(msg.ToolCalls, c.call)
	}
	var fin Finish
	switch {
	case a.refusal.Len() > 0 || a.finish == "content_filter":
		fin = FinishRefusal
	case a.finish == "length":
		fin = FinishLength
	case len(msg.ToolCalls) > 0 && (a.finish == "tool_calls" || a.finish == "stop" || a.finish == "function_call"):
		fin = FinishToolCalls
	case a.finish == "stop":
		fin = FinishStop
	case a.finish == "":
		return Response{}, &failure{diag: "stream ended without a finish_reason", temporary: true}
	case a.finish == "tool_calls":
		return Response{}, &failure{diag: "malformed stream: finish_reason tool_calls without tool calls"}
	default: // e.g. DeepSeek's "insufficient_system_resource"
		return Response{}, &failure{diag: fmt.Sprintf("stream ended with finish_reason %q", a.finish), temporary: true}
	}
	return Response{Message: msg, Finish: fin, Usage: a.usage}, nil
}

// activityBody re-arms the idle timer on every read that got bytes.
type activityBody struct {
	io.ReadCloser
	touch func()
}

func (b *activityBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.touch()
	}
	return n, err
}

// parseRetryAfter reads a Retry-After in seconds (at most retryAfterMax);
// dates and junk give 0.
func parseRetryAfter(v string) time.Duration {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(min(n, int(retryAfterMax/time.Second))) * time.Second
}

// errorBodyMessage extracts the message of an error body: OpenAI and DeepSeek
// send {"error":{"message":...}}, others {"error":"..."} or {"message":...};
// any other body is shown as text, or as the status text when empty.
func errorBodyMessage(body []byte, status int) string {
	var v struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(body, &v) == nil {
		var inner struct {
			Message string `json:"message"`
		}
		var s string
		switch {
		case json.Unmarshal(v.Error, &inner) == nil && inner.Message != "":
			return inner.Message
		case json.Unmarshal(v.Error, &s) == nil && s != "":
			return s
		case v.Message != "":
			return v.Message
		}
	}
	if t := strings.TrimSpace(string(body)); t != "" {
		return t
	}
	if t := http.StatusText(status); t != "" {
		return strings.ToLower(t)
	}
	return "no details"
}

// maskedKey matches the masked key DeepSeek puts in its 401 message
// ("Your api key: ****abcd is invalid").
var maskedKey = regexp.MustCompile(`\*{3,}[A-Za-z0-9_-]*`)

// clean makes a diagnostic safe and short: the key (and any masked key) is
// removed, whitespace is folded to single spaces, and the text is cut to
// diagnosticBytesMax on a rune boundary.
func (o *OpenAI) clean(diag string) string {
	if o.cfg.APIKey != "" {
		diag = strings.ReplaceAll(diag, o.cfg.APIKey, "[redacted]")
	}
	diag = maskedKey.ReplaceAllString(diag, "****")
	diag = strings.Join(strings.Fields(diag), " ")
	if len(diag) <= diagnosticBytesMax {
		return diag
	}
	cut := diagnosticBytesMax - len("...")
	for cut > 0 && !utf8.RuneStart(diag[cut]) {
		cut--
	}
	return diag[:cut] + "..."
}
