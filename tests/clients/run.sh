#!/usr/bin/env bash
# Client conformance suite: the published openai and openai-agents SDKs against the real gateway.
# Creates tests/clients/.venv if missing, installs requirements.txt, builds the binaries, runs pytest.
# Extra arguments go to pytest (e.g. `tests/clients/run.sh -k agents`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$here/.venv"

if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt"

(cd "$root" && cargo build -p gateway -p gateway-testkit)

cd "$here"
# The same scenarios over each provider kind's adapter (the mock model answers every kind).
for provider in ${CLIENTS_PROVIDERS:-openai_chat anthropic openai_responses}; do
  echo "== deployments of kind $provider"
  CLIENTS_PROVIDER="$provider" "$venv/bin/python" -m pytest -q "$@"
done
