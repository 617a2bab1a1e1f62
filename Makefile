# Brood: the two commands of the README are `make run` and `make test`.
GO      ?= go
BIN     := bin/brood
PKGS    := ./...

.PHONY: all build run test test-short bench bench-profile bench-scale chaos chaos-site chaos-seams fuzz vet fmt clean acp-deps ts-deps ts-test mcp-deps mcp-conformance ui-deps ui-screenshot

all: build

build:
	$(GO) build -o $(BIN) ./cmd/brood

# The main job on the embedded default: embedded NATS with JetStream, all
# services, the scripted model; no key, no network.
run: build
	./scripts/demo.sh $(BIN)

# Unit and integration tests on embedded servers, with the race detector.
test: vet acp-deps ts-deps mcp-deps ui-deps
	$(GO) test -race -count=1 -timeout 20m $(PKGS)
	$(MAKE) ts-test
	$(MAKE) mcp-conformance

test-short: acp-deps ui-deps
	$(GO) test -count=1 -timeout 10m $(PKGS)

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	@$(GO) mod tidy -diff || { echo "go.mod or go.sum is not tidy: run go mod tidy"; exit 1; }
	$(GO) vet $(PKGS)

# Benchmarks with their same-run baselines; compare runs with benchstat.
# The throughput benchmark also prints the CPU per run (the process's, and
# Brood's own against the embedded server's, by pprof label). The cold and
# burst benchmarks wait (untimed) for each resumed epoch to end, so they
# run a fixed number of samples (bursts of 30 followups) instead of filling a time.
bench:
	$(GO) test -run '^$$' -bench 'OneShotLatency|OneShotThroughput|FollowupRunning|ReadLog10k' -benchtime 2s -count 1 ./bench/
	$(GO) test -run '^$$' -bench 'FollowupCold|ColdResume10k|FollowupBurst' -benchtime 30x -count 1 ./bench/
	$(GO) test -run '^$$' -bench 'OneShotBudget' -benchtime 500x -count 1 ./bench/

# How the cost grows with the fleet (bench/scale_test.go): one-shot p50 and
# runs/s with 1, 2 and 4 coordinators and worker processes, with 0 and
# 100,000 sessions stored, and with 0, 1,000 and 10,000 continuable children
# resident on one worker, with memory per coordinator and per resident
# child; writes bench/out/scale.md (tables) and bench/out/scale.svg (the
# plot). About 5-10 minutes; bounded at 15.
bench-scale:
	$(GO) test -run '^$$' -bench '^BenchmarkScale$$' -benchtime 1x -count 1 -timeout 15m ./bench/ -args -scale.out=$(CURDIR)/bench/out

# Where the time of a one-shot run goes (bench/profile_test.go): a CPU
# profile of the throughput benchmark's measured loop, by component (the
# server, coordinator, worker and client run under pprof labels; the
# server's JetStream goroutines carry its own account/stream labels) and each
# component's hottest paths; then the median timeline of a sequential run,
# every store write and span with its offsets. Files in bench/out/.
PROFILE_RUNS ?= 15000
bench-profile:
	mkdir -p bench/out
	$(GO) test -c -o bench/out/bench.test ./bench/
	cd bench/out && BROOD_BENCH_CPUPROFILE=cpu.pprof ./bench.test -test.run '^$$' -test.bench 'OneShotThroughput' -test.benchtime $(PROFILE_RUNS)x
	cd bench/out && $(GO) tool pprof -tags bench.test cpu.pprof
	cd bench/out && for c in coordinator worker client; do echo "== $$c"; $(GO) tool pprof -top -cum -nodecount=40 -tagfocus=component=$$c bench.test cpu.pprof; done
	cd bench/out && echo "== server" && $(GO) tool pprof -top -cum -nodecount=40 -focus='nats-server/v2/server' bench.test cpu.pprof
	cd bench/out && ./bench.test -test.run '^$$' -test.bench 'OneShotTimeline' -test.benchtime 500x

# The chaos suite (pkg/chaos, docs/chaos.md): for each seed, the seeded
# workload against a 3-node cluster (2 coordinators, 2 spawn workers, R3)
# under the seeded fault schedule, then the history checker (I1-I8, I10-I12, L1);
# the services run built with -race, so a data race a fault provokes fails it.
# Bounded: about 20 minutes with the defaults. Replay one seed with
# `make chaos CHAOS_SEEDS=7`; keep its stores, logs and history with
# CHAOS_ARGS='-chaos.keep -chaos.history=DIR'.
CHAOS_SEEDS    ?= 1,2,3,4
CHAOS_DURATION ?= 3m
CHAOS_ARGS     ?=
chaos: chaos-seams chaos-site
	$(GO) test -count=1 -timeout 60m -run '^TestChaos$$' -v ./pkg/chaos/ -args -chaos -chaos.race \
		-chaos.seeds=$(CHAOS_SEEDS) -chaos.duration=$(CHAOS_DURATION) $(CHAOS_ARGS)

# The chaos suite's topology with a site (docs/chaos.md; issue 36): one of the
# spawn workers behind a leaf node whose links are cut and slowed.
CHAOS_SITE_SEEDS    ?= 1
CHAOS_SITE_DURATION ?= 2m
chaos-site:
	$(GO) test -count=1 -timeout 30m -run '^TestChaos$$' -v ./pkg/chaos/ -args -chaos -chaos.race -chaos.site \
		-chaos.seeds=$(CHAOS_SITE_SEEDS) -chaos.duration=$(CHAOS_SITE_DURATION) $(CHAOS_ARGS)

# The fuzz targets (Go's native fuzzing, docs in README.md): every
# `func FuzzX(f *testing.F)` of the module, one go test invocation each (go
# test fuzzes one target at a time), FUZZTIME each. `make test` runs their
# seed corpora (testdata/fuzz/FuzzX/) as ordinary tests. A failing input is
# written to testdata/fuzz/FuzzX/ and replays with
# `go test -run 'FuzzX/<file>' ./<package>`: fix the fault and commit the
# input as a regression seed. Pick targets with FUZZ (a regexp over their
# names), e.g. `make fuzz FUZZ=LineFilter FUZZTIME=2m`; FUZZ_ARGS adds go
# test flags (-parallel 1 on a busy machine).
FUZZTIME  ?= 30s
FUZZ      ?= .
FUZZ_ARGS ?=
fuzz:
	@set -e; for file in $$(grep -rl --include='*_test.go' --exclude-dir=node_modules --exclude-dir=.deps '^func Fuzz' . | sort); do \
		dir=$$(dirname $$file); \
		for name in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(f \*testing\.F).*/\1/p' $$file | grep -E -- '$(FUZZ)'); do \
			echo "== $$name ($$dir, $(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $(FUZZ_ARGS) $$dir; \
		done; \
	done

# The seam tests of issue 16, repeated: paused and stale workers (real brood
# processes, SIGSTOP/SIGCONT), leader elections on the 3-node cluster of
# deploy/ (in process, every stream R3, each leader killed in turn). About
# 15 minutes.
chaos-seams: acp-deps
	$(GO) test -race -count=5 -timeout 30m -run 'TestPausedWorker|TestStaleStart|TestSilentProvider|TestWorkerPaused|TestKilled' ./integration/
	$(GO) test -race -count=5 -timeout 30m -run 'TestLeaderElectionsAreNotFailures' ./deploy/

# Mutation testing (MUTATION.md): gremlins (Go module proxy, pinned here)
# mutates the files that carry Brood's guarantees, one target at a time,
# and runs that package's own tests against each mutant (go test -failfast,
# no -race). MUTATE_TARGETS lists dir:file,file...[:word,word...]; the
# package's other files and its sub-packages are left alone. The optional third field runs only
# the tests whose names match one of its words (go test -run, the commas
# read as |): the coordinator's tests take ~40 s a run, so each of its files
# is measured with the tests of its concern. Bounded: one worker, and a
# mutant whose tests run longer than the coverage run times
# MUTATE_TIMEOUT_COEF is timed out (counted apart, as gremlins does;
# GOFLAGS=-count=1 keeps the coverage run out of the test cache, so that
# bound is the real run's). Each target prints its killed/lived counts and
# "Test efficacy" (killed / (killed + lived)); the run fails when a target
# is below MUTATE_THRESHOLD percent or prints no efficacy (checked here:
# gremlins v0.6.0's own --threshold-efficacy let 78.57 % pass, and would
# fail exactly 80 %). CPU-heavy: run it on a quiet machine, one target at a
# time, e.g. MUTATE_TARGETS=internal/agent:inbox.go or
# MUTATE_TARGETS='services/coordinator:authority.go:$(MUTATE_AUTHORITY_TESTS)'.
GREMLINS_VERSION     := v0.6.0
MUTATE_AUTHORITY_TESTS := Authority,Grant,DescendantsDispose,Hostile,RootInbox,EventsRead,BareKey,StartChecks,RootLineage,ReopenRoot,RootLease,ClosingTheRoot,ByHand,LogPages,LogLongPoll,ClientFollow,RunCompletes,DisposeMidRun
MUTATE_TAKEOVER_TESTS  := Takeover,TakenOver,DeadHost,TwoCoordinators,HostLost,Orphan,RunCompletes,DisposeMidRun
MUTATE_ADMISSION_TESTS := StartChecks,StartInputs,Hostile,OpenRoots,LiveChildrenPerParent,FreesItsSlot,Ceilings,DepthCap,AllowList,JSONRequests,NotUTF8,AutoApprove
MUTATE_TARGETS       ?= internal/agent:inbox.go internal/store:inbox.go,records.go,runs.go,leases.go,ownership.go internal/worker:claim.go \
	services/coordinator:slots.go services/coordinator:admission.go,validate.go:$(MUTATE_ADMISSION_TESTS) \
	services/coordinator:authority.go:$(MUTATE_AUTHORITY_TESTS) \
	services/coordinator:takeover.go,orphans.go,liveness.go:$(MUTATE_TAKEOVER_TESTS)
MUTATE_TIMEOUT_COEF  ?= 10
MUTATE_THRESHOLD     ?= 80
MUTATE_ARGS          ?=
mutate:
	GOBIN=$(CURDIR)/.deps/bin $(GO) install github.com/go-gremlins/gremlins/cmd/gremlins@$(GREMLINS_VERSION)
	@failed=""; for target in $(MUTATE_TARGETS); do \
		dir=$${target%%:*}; rest=$${target#*:}; files=$${rest%%:*}; run=""; excl=""; goflags=-count=1; \
		case "$$rest" in *:*) run=$${rest#*:}; goflags="$$goflags -run=$$(printf %s "$$run" | tr , '|')";; esac; \
		for f in $$(cd $$dir && ls *.go | grep -v '_test\.go$$'); do \
			case ",$$files," in *",$$f,"*) ;; *) excl="$$excl -E ^$$f\$$";; esac; \
		done; \
		for d in $$(cd $$dir && find . -mindepth 1 -maxdepth 1 -type d ! -name testdata -printf '%f\n'); do excl="$$excl -E ^$$d/"; done; \
		echo "== $$dir ($$files)$${run:+, tests matching $$run}"; \
		out=$$(mktemp); \
		GOFLAGS="$$goflags" ./.deps/bin/gremlins unleash --workers 1 --timeout-coefficient $(MUTATE_TIMEOUT_COEF) \
			$(MUTATE_ARGS) $$excl ./$$dir 2>&1 | tee $$out; \
		eff=$$(sed -n 's/.*Test efficacy: \([0-9.]*\)%.*/\1/p' $$out | tail -n 1); rm -f $$out; \
		awk -v e="$$eff" -v t=$(MUTATE_THRESHOLD) 'BEGIN { exit !(e != "" && e + 0 >= t + 0) }' || failed="$$failed $$target"; \
	done; \
	if [ -n "$$failed" ]; then echo "below $(MUTATE_THRESHOLD)% test efficacy (or failed):$$failed"; exit 1; fi

fmt:
	gofmt -w .

# What the ACP tests run against (docs/design.md §6), from the registries this
# machine reaches: the ACP Go SDK's example agent (Go module proxy; the
# binary is .deps/bin/agent) and, pinned by integration/testdata/acp's
# package-lock.json, @zed-industries/codex-acp and the ACP TypeScript SDK
# (npm registry). npm ci runs again only when the manifest changes.
ACP_GO_SDK_VERSION := v0.13.0
ACP_NPM_DIR        := integration/testdata/acp

acp-deps: $(ACP_NPM_DIR)/node_modules/.installed
	GOBIN=$(CURDIR)/.deps/bin $(GO) install github.com/coder/acp-go-sdk/example/agent@$(ACP_GO_SDK_VERSION)

$(ACP_NPM_DIR)/node_modules/.installed: $(ACP_NPM_DIR)/package.json $(ACP_NPM_DIR)/package-lock.json
	cd $(ACP_NPM_DIR) && npm ci --no-audit --no-fund
	touch $@

# The TypeScript client (clients/typescript): its dependencies from the npm
# registry, pinned by its committed package-lock.json (npm ci runs again only
# when the manifest changes), and its tests (node --test) against a fresh
# `brood dev` built here, on a free loopback port and a temp data dir.
TS_CLIENT_DIR := clients/typescript

ts-deps: $(TS_CLIENT_DIR)/node_modules/.installed

$(TS_CLIENT_DIR)/node_modules/.installed: $(TS_CLIENT_DIR)/package.json $(TS_CLIENT_DIR)/package-lock.json
	cd $(TS_CLIENT_DIR) && npm ci --no-audit --no-fund
	touch $@

ts-test: ts-deps build
	cd $(TS_CLIENT_DIR) && BROOD_BIN=$(CURDIR)/$(BIN) npm test

# The official MCP conformance suite in server mode against `brood mcp
# --listen` (scripts/mcp-conformance.sh, docs/mcp.md): the suite from the npm
# registry, pinned by services/mcp-server/testdata/conformance's
# package-lock.json (npm ci runs again only when the manifest changes); the
# failures it may report are the committed, explained baseline
# services/mcp-server/testdata/conformance-baseline.yml.
MCP_CONFORMANCE_DIR := services/mcp-server/testdata/conformance

mcp-deps: $(MCP_CONFORMANCE_DIR)/node_modules/.installed

$(MCP_CONFORMANCE_DIR)/node_modules/.installed: $(MCP_CONFORMANCE_DIR)/package.json $(MCP_CONFORMANCE_DIR)/package-lock.json
	cd $(MCP_CONFORMANCE_DIR) && npm ci --no-audit --no-fund
	touch $@

mcp-conformance: mcp-deps build
	./scripts/mcp-conformance.sh $(BIN)

# The browser test of the web view (services/webui) drives headless Chromium:
# Debian's chromium package, installed when missing (CI runs as root on
# Debian; elsewhere install it yourself or set BROOD_CHROMIUM to a binary).
CHROMIUM ?= /usr/bin/chromium

ui-deps:
	@test -x "$${BROOD_CHROMIUM:-$(CHROMIUM)}" || { \
		echo "installing Debian's chromium for the web view's browser test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# docs/web-ui.png, the README's picture of the web view, taken by the browser
# test at the end of its nested delegation.
ui-screenshot: ui-deps
	BROOD_UI_SCREENSHOT=$(CURDIR)/docs/web-ui.png $(GO) test -count=1 -run TestBrowserShowsTheTreeGrowAndTheChildsLog ./services/webui/

clean:
	rm -rf bin .deps $(ACP_NPM_DIR)/node_modules $(TS_CLIENT_DIR)/node_modules $(TS_CLIENT_DIR)/dist $(MCP_CONFORMANCE_DIR)/node_modules
