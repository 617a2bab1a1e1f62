package telemetry

import (
	"io"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families are metric families by name, as gathered or parsed from a scrape.
type Families map[string]*dto.MetricFamily

// ParseText parses a scrape in the Prometheus text format.
func ParseText(r io.Reader) (Families, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(r)
}

// Gather returns the families m's registry holds now.
func (m *Metrics) Gather() (Families, error) {
	fams, err := m.reg.Gather()
	if err != nil {
		return nil, err
	}
	out := Families{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out, nil
}

// Sum is what PromQL's sum(name{labels}) would answer: the sum of the
// samples of name whose labels include every given pair (labels are name,
// value, name, value...; an empty value matches an absent label). A
// histogram's samples are name_count and name_sum. It reports false when no
// sample matched.
func (f Families) Sum(name string, labels ...string) (float64, bool) {
	fam, field := f[name], ""
	if fam == nil {
		for _, suffix := range []string{"_count", "_sum"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && f[base] != nil {
				fam, field = f[base], suffix
			}
		}
	}
	if fam == nil {
		return 0, false
	}
	total, found := 0.0, false
	for _, m := range fam.GetMetric() {
		if !hasLabels(m, labels) {
			continue
		}
		found = true
		switch {
		case field == "_count" && m.GetHistogram() != nil:
			total += float64(m.GetHistogram().GetSampleCount())
		case field == "_sum" && m.GetHistogram() != nil:
			total += m.GetHistogram().GetSampleSum()
		case m.GetCounter() != nil:
			total += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			total += m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			total += m.GetUntyped().GetValue()
		}
	}
	return total, found
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		got := ""
		for _, lp := range m.GetLabel() {
			if lp.GetName() == labels[i] {
				got = lp.GetValue()
			}
		}
		if got != labels[i+1] {
			return false
		}
	}
	return true
}
