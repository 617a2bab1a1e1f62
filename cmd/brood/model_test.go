package main

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestWorkersNameTheirModel is issue 37, item 3's visibility: a worker's
// descriptor names the model it was started with, `brood providers` shows
// it, and the BROOD_MODEL_* variables alone switch a worker to the
// OpenAI-compatible adapter, as the deploy/ files say (it quietly served
// the scripted model without --model openai).
func TestWorkersNameTheirModel(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want []protocol.ModelInfo
		// the turn limits the descriptor shows
		limits protocol.TurnLimits
	}{
		{"--model scripted", nil, []string{"--model", "scripted"}, []protocol.ModelInfo{{Adapter: "scripted", ID: "scripted"}}, protocol.DefaultTurnLimits()},
		{"BROOD_MODEL", map[string]string{"BROOD_MODEL": "scripted"}, nil, []protocol.ModelInfo{{Adapter: "scripted", ID: "scripted"}}, protocol.DefaultTurnLimits()},
		{"BROOD_MODEL_* alone", map[string]string{
			"BROOD_MODEL_NAME": "my-model", "BROOD_MODEL_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "sk-test", "DEEPSEEK_API_KEY": "",
		}, nil, []protocol.ModelInfo{{Adapter: "openai", ID: "my-model"}}, protocol.DefaultTurnLimits()},
		// Several models offered, the first the default (issue 37, item 3:
		// a start chooses among them), and the turn limits set.
		{"--model-name a list", nil, []string{"--model", "scripted", "--model-name", "small,large", "--turn-timeout", "90s", "--steps-per-turn-max", "8", "--tool-calls-per-step-max", "4"},
			[]protocol.ModelInfo{{Adapter: "scripted", ID: "small"}, {Adapter: "scripted", ID: "large"}}, protocol.TurnLimits{TurnTimeoutMs: 90_000, StepsPerTurnMax: 8, ToolCallsPerStepMax: 4}},
		{"BROOD_MODEL_NAME a list", map[string]string{
			"BROOD_MODEL_NAME": "chat, reasoner", "BROOD_MODEL_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "sk-test", "DEEPSEEK_API_KEY": "",
		}, nil, []protocol.ModelInfo{{Adapter: "openai", ID: "chat"}, {Adapter: "openai", ID: "reasoner"}}, protocol.DefaultTurnLimits()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			s := stack.New(t)
			s.AddCoordinator()
			url := s.Server.ClientURL()
			c := &cli{t: t, stack: s, url: url}
			var listed protocol.ProvidersListReply
			c.serveDuring(t, "providers=[spawn]", func() {
				testutil.Eventually(t, 30*time.Second, func() bool {
					r, err := s.Client.Providers(context.Background())
					listed = r
					return err == nil && r.Instances["spawn"] == 1
				}, "the worker listed")
			}, append([]string{"spawn-worker", "--nats", url, "--heartbeat", "100ms", "--host-expiry", "1s"}, tc.args...)...)
			if len(listed.Providers) != 1 || !slices.Equal(listed.Providers[0].Models, tc.want) {
				t.Fatalf("providers.list: %+v, want the models %v", listed.Providers, tc.want)
			}
			if l := listed.Providers[0].Limits; l == nil || *l != tc.limits {
				t.Fatalf("providers.list: limits %+v, want %+v", l, tc.limits)
			}
		})
	}
}

// TestProvidersShowTheModel: the table's MODEL column (adapter/id), "-"
// for a provider that names none.
func TestProvidersShowTheModel(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	url := s.Server.ClientURL()
	c := &cli{t: t, stack: s, url: url}
	var table string
	c.serveDuring(t, "providers=[spawn]", func() {
		testutil.Eventually(t, 30*time.Second, func() bool {
			table = c.run("providers").out
			return strings.Contains(table, "scripted/scripted")
		}, "the worker listed with its model")
	}, "spawn-worker", "--nats", url, "--model", "scripted", "--heartbeat", "100ms", "--host-expiry", "1s")
	if !regexp.MustCompile(`(?m)^PROVIDER +INSTANCES .* TOOLS +APPROVE-TOOLS +MODEL$`).MatchString(table) ||
		!regexp.MustCompile(`(?m)^spawn +1 +yes .* scripted/scripted$`).MatchString(table) {
		t.Fatalf("table:\n%s", table)
	}
	if got := models(nil); got != "-" {
		t.Fatalf("no models: %q", got)
	}
}

// TestAWorkerRefusesToStartWithoutAModel: outside brood dev a worker does
// not fall back to the scripted model (issue 37, item 3: a production
// worker quietly served it); naming it (--model scripted) starts one, as
// TestWorkersNameTheirModel shows.
func TestAWorkerRefusesToStartWithoutAModel(t *testing.T) {
	for _, k := range []string{"BROOD_MODEL", "BROOD_MODEL_NAME", "BROOD_MODEL_BASE_URL"} {
		t.Setenv(k, "")
	}
	s := stack.New(t)
	s.AddCoordinator()
	c := &cli{t: t, stack: s, url: s.Server.ClientURL()}
	for _, verb := range []string{"spawn-worker", "fork-worker"} {
		o := c.run(verb)
		if o.code != 1 || !strings.HasPrefix(o.err, "INVALID_ARGUMENT: no model named") || !strings.Contains(o.err, "--model scripted") {
			t.Fatalf("%s without a model: exit %d, stderr %q; want INVALID_ARGUMENT naming the way to choose one", verb, o.code, o.err)
		}
	}
}
