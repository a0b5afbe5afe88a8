#!/usr/bin/env bash
# Client conformance suite: the published Python SDKs (openai, openai-agents, pydantic-ai) and Node clients
# (openai-node, the Vercel AI SDK, the Codex CLI) against the real gateway.
# Creates tests/clients/.venv if missing, installs requirements.txt and node/package-lock.json (npm ci),
# builds the binaries, runs pytest.
# Extra arguments go to pytest (e.g. `tests/clients/run.sh -k agents`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$here/.venv"

if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt"

# The Node clients, exactly as locked; reinstalled only when the lock file changed since the last install.
lock_sum="$(sha256sum "$here/node/package-lock.json" | cut -d' ' -f1)"
if [ "$(cat "$here/node/node_modules/.installed-lock" 2>/dev/null)" != "$lock_sum" ]; then
  (cd "$here/node" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$lock_sum" > "$here/node/node_modules/.installed-lock"
fi

# gateway, and the testkit's mock-model, example-tools and example-mcp.
(cd "$root" && cargo build -p gateway -p gateway-testkit)

cd "$here"
# The same scenarios over each provider kind's adapter (the mock model answers every kind).
for provider in ${CLIENTS_PROVIDERS:-openai_chat anthropic openai_responses}; do
  echo "== deployments of kind $provider"
  CLIENTS_PROVIDER="$provider" "$venv/bin/python" -m pytest -q "$@"
done
