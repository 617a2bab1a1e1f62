package rpc

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"math"
	"math/big"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/brood-dev/brood/internal/testutil/fuzzcheck"
	"github.com/brood-dev/brood/pkg/protocol"
)

// requestTypes are the messages the handlers decode, by the endpoint (a
// coordinator endpoint, `provider.<op>` or `host.<op>`) whose handler
// decodes them with Request.Decode. Keep it in step with the handlers.
var requestTypes = map[string]func() any{
	protocol.EpAgentsOpen:                     func() any { return new(protocol.AgentsOpenRequest) },
	protocol.EpAgentsRenew:                    func() any { return new(protocol.ParentRef) },
	protocol.EpAgentsClose:                    func() any { return new(protocol.ParentRef) },
	protocol.EpRunsStart:                      func() any { return new(protocol.RunStartRequest) },
	protocol.EpRunsAwait:                      func() any { return new(protocol.RunRef) },
	protocol.EpRunsDispose:                    func() any { return new(protocol.RunRef) },
	protocol.EpContinuableStart:               func() any { return new(protocol.ContinuableStartRequest) },
	protocol.EpContinuableFollowup:            func() any { return new(protocol.FollowupRequest) },
	protocol.EpContinuableState:               func() any { return new(protocol.ChildRef) },
	protocol.EpContinuableInterrupt:           func() any { return new(protocol.InterruptRequest) },
	protocol.EpContinuableReport:              func() any { return new(protocol.ReportRequest) },
	protocol.EpContinuableDrain:               func() any { return new(protocol.DrainRequest) },
	protocol.EpContinuableDrains:              func() any { return new(protocol.DrainsListRequest) },
	protocol.EpChildrenList:                   func() any { return new(protocol.ChildrenListRequest) },
	protocol.EpDescendantsDispose:             func() any { return new(protocol.DescendantsDisposeRequest) },
	protocol.EpSessionsResult:                 func() any { return new(protocol.SessionResultRequest) },
	protocol.EpSessionsGet:                    func() any { return new(protocol.SessionGetRequest) },
	protocol.EpSessionsLog:                    func() any { return new(protocol.LogReadRequest) },
	protocol.EpEventsRead:                     func() any { return new(protocol.EventsReadRequest) },
	protocol.EpEventsFollow:                   func() any { return new(protocol.EventsFollowRequest) },
	"events.follow.credit":                    func() any { return new(protocol.FollowCreditRequest) },
	protocol.EpInboxRead:                      func() any { return new(protocol.InboxReadRequest) },
	protocol.EpInboxAck:                       func() any { return new(protocol.InboxAckRequest) },
	protocol.EpRequestsOpen:                   func() any { return new(protocol.RequestOpenRequest) },
	protocol.EpRequestsGet:                    func() any { return new(protocol.RequestGetRequest) },
	protocol.EpRequestsAnswer:                 func() any { return new(protocol.RequestAnswerRequest) },
	protocol.EpRequestsList:                   func() any { return new(protocol.RequestsListRequest) },
	protocol.EpBudgetReserve:                  func() any { return new(protocol.BudgetReserveRequest) },
	protocol.EpBudgetSettle:                   func() any { return new(protocol.BudgetSettleRequest) },
	protocol.EpBudgetGet:                      func() any { return new(protocol.BudgetGetRequest) },
	protocol.EpBudgetRaise:                    func() any { return new(protocol.BudgetRaiseRequest) },
	"provider." + protocol.OpProviderStart:    func() any { return new(protocol.ProviderStartRequest) },
	"provider." + protocol.OpProviderActivate: func() any { return new(protocol.ActivateRequest) },
	"provider." + protocol.OpProviderPrepare:  func() any { return new(protocol.ProviderPrepareRequest) },
	"provider." + protocol.OpProviderContinue: func() any { return new(protocol.ProviderContinueRequest) },
	"host." + protocol.OpHostDispose:          func() any { return new(protocol.HostRunRequest) },
	"host." + protocol.OpHostCancel:           func() any { return new(protocol.HostRunRequest) },
	"host." + protocol.OpHostInterrupt:        func() any { return new(protocol.HostChildRequest) },
	"host." + protocol.OpHostState:            func() any { return new(protocol.HostChildRequest) },
}

// requestType returns the endpoint's message; an endpoint the table does not
// name (the fuzzer mutates names too) picks one by its hash, so every input
// decodes into some real request type.
func requestType(endpoint string) (string, func() any) {
	if newV, ok := requestTypes[endpoint]; ok {
		return endpoint, newV
	}
	names := make([]string, 0, len(requestTypes))
	for n := range requestTypes {
		names = append(names, n)
	}
	slices.Sort(names)
	h := fnv.New32a()
	h.Write([]byte(endpoint))
	name := names[h.Sum32()%uint32(len(names))]
	return name, requestTypes[name]
}

// decodeAllocBound bounds what decoding one request may allocate: a
// MessagePack body's declared lengths are checked against its size before
// decoding (protocol.CheckMsgpack), so every allocation is paid for by input
// bytes. 256 bytes per input byte covers the densest case measured (a
// one-byte empty map inside an untyped field costs a map header and its
// interface, about 100 bytes; JSON's `{}` costs about the same for 2 bytes).
var decodeAllocBound = fuzzcheck.Bound{Base: 64 << 10, PerByte: 256}

// FuzzDecodeRequest feeds request bodies, with or without a Content-Type
// header, to Request.Decode (the one decode path of every coordinator,
// provider and host handler) as the message the endpoint's handler decodes.
// Properties:
//   - a rejected body is a *protocol.Error INVALID_ARGUMENT (numeric 1001)
//     whose reply body encodes in the request's encoding and decodes back
//     with its code;
//   - an accepted body re-encodes in its encoding, and that is accepted and
//     decodes to the same value (numbers compared by value, NaN equal to
//     itself); a JSON request's value re-encoded as MessagePack decodes to
//     the same value too;
//   - decoding allocates at most decodeAllocBound.
func FuzzDecodeRequest(f *testing.F) {
	fuzzcheck.SeedsPresent(f, "FuzzDecodeRequest", 20)
	f.Add(protocol.EpRunsStart, "", []byte{0x80})
	f.Fuzz(func(t *testing.T, endpoint, contentType string, body []byte) {
		name, newV := requestType(endpoint)
		header := nats.Header{}
		if contentType != "" {
			header[protocol.HeaderContentType] = []string{contentType}
		}
		req := requestOf(nil, &nats.Msg{Subject: "brood.v1." + name, Header: header, Data: body})
		var v any
		var err error
		fuzzcheck.AllocWithin(t, "decoding "+name, decodeAllocBound.Of(len(body)), func() {
			v = newV()
			err = req.Decode(v)
		})
		if err != nil {
			checkRejection(t, req.Encoding, err)
			return
		}
		roundTrip(t, req.Encoding, v, newV)
		if req.Encoding == protocol.JSON {
			roundTrip(t, protocol.Msgpack, v, newV)
		}
	})
}

func checkRejection(t *testing.T, enc protocol.Encoding, err error) {
	t.Helper()
	var pe *protocol.Error
	if !asProtocolError(err, &pe) {
		t.Fatalf("rejection %T %v is not a *protocol.Error", err, err)
	}
	if pe.Code != protocol.CodeInvalidArgument || pe.Code.Number() != 1001 || pe.Message == "" {
		t.Fatalf("rejection %q (%d): want INVALID_ARGUMENT (1001) with a message", pe.Error(), pe.Code.Number())
	}
	body, merr := protocol.Marshal(enc, pe)
	if merr != nil {
		t.Fatalf("the error reply does not encode in %s: %v", enc, merr)
	}
	var back protocol.Error
	if uerr := protocol.Unmarshal(enc, body, &back); uerr != nil || back.Code != pe.Code {
		t.Fatalf("the error reply decodes to %+v, %v", back, uerr)
	}
}

func asProtocolError(err error, pe **protocol.Error) bool {
	e, ok := err.(*protocol.Error)
	*pe = e
	return ok
}

// roundTrip encodes v in enc, decodes that as a request again and compares.
func roundTrip(t *testing.T, enc protocol.Encoding, v any, newV func() any) {
	t.Helper()
	data, err := protocol.Marshal(enc, v)
	if err != nil {
		t.Fatalf("an accepted %T does not encode in %s: %v", v, enc, err)
	}
	back := newV()
	if err := protocol.UnmarshalRequest(enc, data, back); err != nil {
		t.Fatalf("%T encoded in %s is refused: %v\nencoded: %q", v, enc, err, data)
	}
	a, b := wireValue(t, v), wireValue(t, back)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("%T changed across a %s round trip:\nbefore %#v\nafter  %#v", v, enc, a, b)
	}
}

// wireValue is v as the wire sees it, comparable with reflect.DeepEqual: v
// encoded as MessagePack with sorted map keys and decoded as untyped values,
// every number then written as its exact value ("n:<rational>", "n:NaN",
// "n:+Inf", "n:-0"), so an integer and an integral float compare equal, as
// they do in JSON.
func wireValue(t *testing.T, v any) any {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	if err := enc.Encode(v); err != nil {
		t.Fatalf("encode %T: %v", v, err)
	}
	d := msgpack.NewDecoder(&buf)
	d.UseLooseInterfaceDecoding(true)
	out, err := d.DecodeInterface()
	if err != nil {
		t.Fatalf("decode %T: %v", v, err)
	}
	return exactNumbers(out)
}

func exactNumbers(v any) any {
	switch x := v.(type) {
	case int64:
		return "n:" + big.NewRat(x, 1).RatString()
	case uint64:
		return "n:" + new(big.Rat).SetInt(new(big.Int).SetUint64(x)).RatString()
	case float64:
		switch {
		case math.IsNaN(x):
			return "n:NaN"
		case math.IsInf(x, 0):
			return fmt.Sprintf("n:%+v", x)
		case x == 0 && math.Signbit(x):
			return "n:-0"
		}
		return "n:" + new(big.Rat).SetFloat64(x).RatString()
	case string:
		if strings.HasPrefix(x, "n:") {
			return "s:" + x // a string never passes for a number
		}
		return x
	case map[string]any:
		for k, e := range x {
			x[k] = exactNumbers(e)
		}
		return x
	case map[any]any:
		m := make(map[any]any, len(x))
		for k, e := range x {
			m[exactNumbers(k)] = exactNumbers(e)
		}
		return m
	case []any:
		for i, e := range x {
			x[i] = exactNumbers(e)
		}
		return x
	default:
		return v
	}
}
