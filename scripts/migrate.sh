#!/usr/bin/env sh
# Deploy step: bring the database schema up to date before new api/worker processes start.
#
# River's own CLI (`river migrate-up`, from github.com/riverqueue/river/cmd/river) applies River's
# migrations when it is installed; `postguard migrate` then applies River's (a no-op after the CLI:
# both record them in the same river_migration table) and the app's. Each step is idempotent and
# either order works, so running this script twice, or concurrently from two deploys
# (postguard migrate holds an advisory lock), is safe.
#
# Environment: DATABASE_URL (postgres://…); APP_SECRET is optional: given, postguard migrate
# records it as the database's secret (or refuses one that is not), else the first process does.
# POSTGUARD: the postguard binary (default: postguard on PATH, else `go run ./cmd/postguard`).
set -eu

: "${DATABASE_URL:?DATABASE_URL must name the database to migrate}"

if command -v river >/dev/null 2>&1; then
  echo "migrate.sh: river migrate-up"
  river migrate-up --database-url "$DATABASE_URL"
else
  echo "migrate.sh: River CLI not installed; postguard migrate applies River's migrations itself"
fi

if [ -n "${POSTGUARD:-}" ]; then
  set -- $POSTGUARD
elif command -v postguard >/dev/null 2>&1; then
  set -- postguard
else
  set -- go run ./cmd/postguard
fi
echo "migrate.sh: $* migrate"
"$@" migrate
