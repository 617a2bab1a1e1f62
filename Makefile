# Brood: the two commands of the README are `make run` and `make test`.
GO      ?= go
BIN     := bin/brood
PKGS    := ./...

.PHONY: all build run test test-short bench chaos vet fmt clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/brood

# The main job on the embedded default: embedded NATS with JetStream, all
# services, the scripted model; no key, no network.
run: build
	./scripts/demo.sh $(BIN)

# Unit and integration tests on embedded servers, with the race detector.
test: vet
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

test-short:
	$(GO) test -count=1 -timeout 10m $(PKGS)

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet $(PKGS)

# Benchmarks with their same-run baselines; compare runs with benchstat.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s -count 1 ./bench/

fmt:
	gofmt -w .

clean:
	rm -rf bin
