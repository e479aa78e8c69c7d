SHELL := /bin/bash
# The README's commands. `make run` serves on the embedded SQLite default; `make test` runs every
# test (PostgreSQL ones skip with a reason when it is unreachable, and fail under CI=true).

FUZZTIME ?= 10s
SOAK_DURATION ?= 3m
SOAK_FLAGS ?=
GO ?= go

.PHONY: run test generate lint lint-openapi axe-core bench fuzz load soak

run:
	$(GO) run ./cmd/postguard serve

test:
	set -o pipefail; $(GO) test -count=1 -json ./... | $(GO) run ./scripts/testsummary

generate:
	$(GO) tool sqlc generate

lint:
	gofmt -l $$(git ls-files '*.go') | (! grep .)
	$(GO) vet ./...
	$(GO) tool sqlc diff
	$(GO) tool golangci-lint run ./...

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

# The built binary as separate api and worker processes, under load and faults, then checked.
soak:
	$(GO) build -o bin/postguard ./cmd/postguard
	$(GO) run ./cmd/postguard-soak -postguard bin/postguard -duration $(SOAK_DURATION) $(SOAK_FLAGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzClientIP$$' -fuzztime $(FUZZTIME) ./api/abuse
	$(GO) test -run '^$$' -fuzz '^FuzzParseLimit$$' -fuzztime $(FUZZTIME) ./api/abuse
	$(GO) test -run '^$$' -fuzz '^FuzzNormalizeEmail$$' -fuzztime $(FUZZTIME) ./api
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRegister$$' -fuzztime $(FUZZTIME) ./api
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeForgotPassword$$' -fuzztime $(FUZZTIME) ./api
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeResendVerification$$' -fuzztime $(FUZZTIME) ./api
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeVerifyEmail$$' -fuzztime $(FUZZTIME) ./api
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeResetPassword$$' -fuzztime $(FUZZTIME) ./api
