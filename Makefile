SHELL := /bin/bash
# The README's commands. `make run` serves on the embedded SQLite default; `make test` runs every
# test (PostgreSQL ones skip with a reason when it is unreachable, and fail under CI=true).
#
# The repository holds three modules (docs/design.md, "Modules"): the library at the root, the
# service in cmd/, the tools in tools/. go.work joins the first two for `go run`, `go build` and
# editors; test and lint check each module on its own go.mod (GOWORK=off), as its users build
# it, and the tools run from tools/go.mod, so that no tool's requirements reach either module.

# Each fuzz target's budget, as a count of inputs (`go test -fuzztime Nx`). A duration also works,
# but Go 1.26's fuzzing coordinator can then fail a clean run at its deadline with a bare "context
# deadline exceeded" and no failing input (Go issue 75804, fixed in 1.27); a count has no deadline.
# FUZZTIME_HTTP is the budget of the api targets, which send each input through the router and
# run some hundred times slower.
FUZZTIME ?= 30000x
FUZZTIME_HTTP ?= 1000x
SOAK_DURATION ?= 3m
SOAK_FLAGS ?=
GO ?= go
MODULES := . cmd
TOOL := GOWORK=off $(GO) tool -modfile=$(CURDIR)/tools/go.mod

.PHONY: run test generate lint lint-openapi axe-core bench fuzz load load-outside soak

run:
	$(GO) run ./cmd/postguard serve

# Every module's tests, summed in one summary.
test:
	set -o pipefail; for m in $(MODULES); do (cd $$m && GOWORK=off $(GO) test -count=1 -json ./...); done | $(GO) run ./scripts/testsummary

generate:
	$(TOOL) sqlc generate

# gofmt, then per module: go vet, go.mod and go.sum tidy, golangci-lint; and sqlc's code matching
# its queries.
lint:
	gofmt -l $$(git ls-files '*.go') | (! grep .)
	for m in $(MODULES) tools; do (cd $$m && GOWORK=off $(GO) mod tidy -diff) || exit 1; done
	for m in $(MODULES); do (cd $$m && GOWORK=off $(GO) vet ./...) || exit 1; done
	$(TOOL) sqlc diff
	for m in $(MODULES); do (cd $$m && $(TOOL) golangci-lint run ./...) || exit 1; done

# The OpenAPI document against Redocly's recommended rules (needs Node and the npm registry).
# Its warnings are true of the service: GET and HEAD routes with no 4xx answer, a redirect with no 2xx.
REDOCLY ?= npx -y @redocly/cli@2.77.0
lint-openapi:
	$(REDOCLY) lint --format=stylish api/openapi.yaml

# axe-core, the accessibility engine the browser tests inject into every page and mail, at the
# version and hash scripts/axe/package-lock.json pins, into scripts/axe/node_modules (not
# committed). Needs Node and the npm registry; without it those tests skip (fail under CI=true).
NPM ?= npm
axe-core:
	$(NPM) ci --prefix scripts/axe --no-audit --no-fund

load:
	$(GO) run ./cmd/postguard-load

# The built binary from outside its process: wrk against `postguard serve` beside pgbench's
# two-upsert ceiling, and one check's idle latency (scripts/outside/run.sh says how; needs
# PostgreSQL at PGBASE). OUTSIDE_FLAGS=-baseline REV adds REV's binary, rounds alternating.
OUTSIDE_FLAGS ?=
load-outside:
	scripts/outside/run.sh $(OUTSIDE_FLAGS)

# The built binary as separate api and worker processes, under load and faults, then checked.
soak:
	$(GO) build -o bin/postguard ./cmd/postguard
	$(GO) run ./cmd/postguard-soak -postguard bin/postguard -duration $(SOAK_DURATION) $(SOAK_FLAGS)

bench:
	for m in $(MODULES); do (cd $$m && GOWORK=off $(GO) test -run '^$$' -bench . -benchmem ./...) || exit 1; done

fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzClientIP$$' -fuzztime $(FUZZTIME) ./api/abuse
	$(GO) test -run '^$$' -fuzz '^FuzzParseLimit$$' -fuzztime $(FUZZTIME) ./api/abuse
	$(GO) test -run '^$$' -fuzz '^FuzzNormalize$$' -fuzztime $(FUZZTIME) ./email
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRegister$$' -fuzztime $(FUZZTIME_HTTP) ./api
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeForgotPassword$$' -fuzztime $(FUZZTIME_HTTP) ./api
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeResendVerification$$' -fuzztime $(FUZZTIME_HTTP) ./api
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeVerifyEmail$$' -fuzztime $(FUZZTIME_HTTP) ./api
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeResetPassword$$' -fuzztime $(FUZZTIME_HTTP) ./api
