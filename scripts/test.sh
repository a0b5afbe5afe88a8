#!/usr/bin/env bash
# Runs the whole test suite: Rust unit, store and end-to-end tests against the local Postgres.
set -euo pipefail
cd "$(dirname "$0")/.."

export TEST_DATABASE_URL="${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"

# Postgres must answer; on the project's machines it is installed but may be stopped.
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start
  fi
  for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi

# The console's browser test (tests/e2e/tests/browser.rs) drives headless Chromium.
scripts/install-browser.sh

# The operator quick start (docs/operator-quickstart.md) is run as written by a test: it needs curl and jq.
if ! command -v jq >/dev/null 2>&1 || ! command -v curl >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq curl >/dev/null
fi

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
  # The end-to-end suite once more, on the embedded store (SQLite) instead of Postgres.
  GATEWAY_TEST_STORE=sqlite cargo nextest run -p gateway-e2e --test api --no-fail-fast
else
  cargo test --workspace --no-fail-fast
  GATEWAY_TEST_STORE=sqlite cargo test -p gateway-e2e --test api --no-fail-fast
fi
tests/clients/run.sh
