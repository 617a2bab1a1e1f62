package bench

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// CPU per run (issue 31, item 5). The whole process's CPU over a benchmark's
// measured window is getrusage(RUSAGE_SELF)'s user + system time: exact,
// the kernel's accounting, but one figure for everything in the process
// (server, coordinator, worker, client, runtime). Its split by component
// comes from a CPU profile of the same window (100 Hz per thread) read by
// pprof label: the stack starts the server, the coordinator, the worker and
// the client each under component=<name> (profile_test.go) and goroutines
// inherit their creator's labels, so the server's connection goroutines
// carry component=server; the server's JetStream goroutines (stream, consumer
// and raft loops) replace their labels with their own (nats-server's
// setGoRoutineLabels: account, stream, consumer, type), and are counted as
// the server's. The runtime's own goroutines (GC background workers, the
// scavenger) inherit no labels and are reported apart as unlabelled: GC is
// every component's cost and is not apportioned. A GC assist is charged to
// the goroutine that allocated, so it is in that component's figure.
//
// The server's own figures were not used: its /varz CPU is the process's
// (it is embedded), and it counts no CPU per connection or stream.

// serverLabelKeys are the pprof label keys nats-server gives the goroutines
// it starts with labels of their own (nats-server v2 server.go,
// setGoRoutineLabels; its callers in stream.go, consumer.go,
// jetstream_cluster.go).
var serverLabelKeys = []string{"account", "stream", "consumer", "type"}

// unlabelled names the samples that carry no label of a component.
const unlabelled = "unlabelled"

// cpuWindow measures the process's CPU over a measured window.
type cpuWindow struct {
	ru0       syscall.Rusage
	buf       bytes.Buffer
	profiling bool
	err       error // why there is no split, when there is none
}

// startCPUWindow starts measuring: getrusage now, and a CPU profile into
// memory (written to $BROOD_BENCH_CPUPROFILE too when it is set, for
// make bench-profile's listings). A profile already running (go test
// -cpuprofile) leaves the window without its split.
func startCPUWindow(b testing.TB) *cpuWindow {
	b.Helper()
	w := &cpuWindow{}
	if err := pprof.StartCPUProfile(&w.buf); err != nil {
		w.err = err
	} else {
		w.profiling = true
	}
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &w.ru0); err != nil {
		b.Fatal(err)
	}
	return w
}

// cpuFigures are the CPU a window spent.
type cpuFigures struct {
	process     time.Duration            // user + system, getrusage
	byComponent map[string]time.Duration // CPU profile samples by component
	sampled     time.Duration            // all the profile's samples
	samples     int64
	err         error // why byComponent is empty, if it is
}

func rusageCPU(ru syscall.Rusage) time.Duration {
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// stop ends the window and returns its figures.
func (w *cpuWindow) stop(b testing.TB) cpuFigures {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	f := cpuFigures{process: rusageCPU(ru) - rusageCPU(w.ru0), err: w.err}
	if !w.profiling {
		return f
	}
	pprof.StopCPUProfile()
	if path := os.Getenv("BROOD_BENCH_CPUPROFILE"); path != "" {
		if err := os.WriteFile(path, w.buf.Bytes(), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	byLabels, samples, err := cpuByLabels(w.buf.Bytes())
	if err != nil {
		b.Fatalf("reading the CPU profile: %v", err)
	}
	f.samples = samples
	f.byComponent = map[string]time.Duration{}
	for labels, d := range byLabels {
		f.byComponent[componentOf(labels)] += d
		f.sampled += d
	}
	return f
}

// componentOf names the component of a sample by its labels ("k=v,k=v",
// sorted).
func componentOf(labels string) string {
	if labels == "" {
		return unlabelled
	}
	for _, kv := range strings.Split(labels, ",") {
		if v, ok := strings.CutPrefix(kv, "component="); ok {
			return v
		}
	}
	for _, kv := range strings.Split(labels, ",") {
		for _, k := range serverLabelKeys {
			if strings.HasPrefix(kv, k+"=") {
				return "server"
			}
		}
	}
	return unlabelled
}

// cpuByLabels reads a CPU profile (runtime/pprof's gzipped profile.proto)
// and sums its samples' CPU by their string labels (each sample's labels as
// "k=v,k=v", sorted; "" for none). It reads only what it needs: the string
// table, the sample types and the samples' values and labels.
func cpuByLabels(gz []byte) (map[string]time.Duration, int64, error) {
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, 0, err
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return nil, 0, err
	}
	type label struct{ key, str int64 }
	type sample struct {
		values []int64
		labels []label
	}
	var (
		strs    []string
		types   [][2]int64 // (type, unit) string indexes
		samples []sample
	)
	// Field numbers of profile.proto (github.com/google/pprof/proto/profile.proto).
	const (
		profileSampleType  = 1
		profileSample      = 2
		profileStringTable = 6
		valueTypeType      = 1
		valueTypeUnit      = 2
		sampleValue        = 2
		sampleLabel        = 3
		labelKey           = 1
		labelStr           = 2
	)
	err = eachField(raw, func(num protowire.Number, typ protowire.Type, v uint64, bs []byte) error {
		switch {
		case num == profileStringTable && typ == protowire.BytesType:
			strs = append(strs, string(bs))
		case num == profileSampleType && typ == protowire.BytesType:
			var vt [2]int64
			err := eachField(bs, func(n protowire.Number, _ protowire.Type, v uint64, _ []byte) error {
				switch n {
				case valueTypeType:
					vt[0] = int64(v)
				case valueTypeUnit:
					vt[1] = int64(v)
				}
				return nil
			})
			types = append(types, vt)
			return err
		case num == profileSample && typ == protowire.BytesType:
			var s sample
			err := eachField(bs, func(n protowire.Number, t protowire.Type, v uint64, b []byte) error {
				switch {
				case n == sampleValue && t == protowire.VarintType:
					s.values = append(s.values, int64(v))
				case n == sampleValue && t == protowire.BytesType: // packed
					for len(b) > 0 {
						x, k := protowire.ConsumeVarint(b)
						if k < 0 {
							return protowire.ParseError(k)
						}
						s.values = append(s.values, int64(x))
						b = b[k:]
					}
				case n == sampleLabel && t == protowire.BytesType:
					var l label
					err := eachField(b, func(n protowire.Number, _ protowire.Type, v uint64, _ []byte) error {
						switch n {
						case labelKey:
							l.key = int64(v)
						case labelStr:
							l.str = int64(v)
						}
						return nil
					})
					s.labels = append(s.labels, l)
					return err
				}
				return nil
			})
			samples = append(samples, s)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	str := func(i int64) string {
		if i < 0 || int(i) >= len(strs) {
			return ""
		}
		return strs[i]
	}
	cpu, count := -1, -1
	for i, t := range types {
		switch str(t[0]) + "/" + str(t[1]) {
		case "cpu/nanoseconds":
			cpu = i
		case "samples/count":
			count = i
		}
	}
	if cpu < 0 || count < 0 {
		return nil, 0, fmt.Errorf("no cpu/nanoseconds and samples/count values in the profile")
	}
	out := map[string]time.Duration{}
	var n int64
	for _, s := range samples {
		if cpu >= len(s.values) || count >= len(s.values) {
			return nil, 0, fmt.Errorf("a sample of %d values", len(s.values))
		}
		kv := make([]string, 0, len(s.labels))
		for _, l := range s.labels {
			kv = append(kv, str(l.key)+"="+str(l.str))
		}
		sort.Strings(kv)
		out[strings.Join(kv, ",")] += time.Duration(s.values[cpu])
		n += s.values[count]
	}
	return out, n, nil
}

// eachField calls f with each field of the protobuf message b: its number,
// wire type and value (v for varints and fixed, bs for bytes).
func eachField(b []byte, f func(num protowire.Number, typ protowire.Type, v uint64, bs []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v uint64
		var bs []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.Fixed64Type:
			v, n = protowire.ConsumeFixed64(b)
		case protowire.Fixed32Type:
			var x uint32
			x, n = protowire.ConsumeFixed32(b)
			v = uint64(x)
		case protowire.BytesType:
			bs, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := f(num, typ, v, bs); err != nil {
			return err
		}
	}
	return nil
}

// reportCPU prints and reports a window's CPU per run: the process's, each
// component's and Brood's own (coordinator + worker) against the server's.
func reportCPU(b *testing.B, what string, f cpuFigures, runs int) {
	b.Helper()
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(runs) }
	b.ReportMetric(us(f.process), "cpu-us/run")
	if f.byComponent == nil {
		fmt.Printf("%s: CPU per run %.0f µs (process, user + system, getrusage); no split by component (%v)\n", what, us(f.process), f.err)
		return
	}
	c := f.byComponent
	own, server := c["coordinator"]+c["worker"], c["server"]
	var others []string
	for k, d := range c {
		switch k {
		case "server", "coordinator", "worker", "client", unlabelled:
		default:
			others = append(others, fmt.Sprintf(", %s %.0f µs", k, us(d)))
		}
	}
	sort.Strings(others)
	ratio := "n/a (no server samples)"
	if server > 0 {
		ratio = fmt.Sprintf("%.2f", float64(own)/float64(server))
		b.ReportMetric(float64(own)/float64(server), "ratio-brood/server-cpu")
	}
	b.ReportMetric(us(server), "server-cpu-us/run")
	b.ReportMetric(us(own), "brood-cpu-us/run")
	fmt.Printf("%s: CPU per run %.0f µs (process, user + system, getrusage); by pprof label (%d samples, %.0f µs per run sampled): server %.0f µs (its JetStream goroutines included), coordinator %.0f µs, worker %.0f µs, client %.0f µs, unlabelled runtime (GC workers) %.0f µs%s; Brood's own (coordinator + worker) ÷ server = %s (acceptance ≤ 2)\n",
		what, us(f.process), f.samples, us(f.sampled), us(server), us(c["coordinator"]), us(c["worker"]), us(c["client"]), us(c[unlabelled]), strings.Join(others, ""), ratio)
}
