#!/usr/bin/env bash
# Our gateway and LiteLLM's proxy side by side (issue 27): the same Responses request through each, in front of
# the same mock model process, closed loop at a fixed concurrency, alternated slice by slice, with the mock model
# itself as the ceiling. Both proxies turn the Responses request into a Chat Completions call to the mock. Prints a
# Markdown table (req/s, p50/p99, errors, CPU per request, gateway ÷ LiteLLM) and the load average.
#
# Needs the release build (cargo build --release -p gateway -p gateway-testkit -p gateway-bench), python3 (LiteLLM
# is installed from PyPI into a throw-away venv: it is never a project dependency), wrk, jq and curl (installed
# with apt-get when missing), and Postgres on 127.0.0.1:5432 unless --embedded.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/bench-litellm.sh [options]

  --concurrency N        connections sending back to back, per target (default 32)
  --duration S           measured seconds per target (default 30)
  --slice S              targets take turns every S seconds (default 2): gateway, LiteLLM, mock, then
                         LiteLLM, gateway, mock, ... so that all meet the same machine conditions
  --warmup S             unmeasured seconds per target before measuring (default 5: LiteLLM's first
                         requests cost far more than the later ones)
  --litellm-version V    litellm[proxy]==V from PyPI (default 1.106.2)
  --litellm-workers N    LiteLLM's uvicorn workers (default: the number of cores, as LiteLLM recommends;
                         1 is LiteLLM's own default)
  --embedded             our gateway on its embedded store (SQLite in the temporary directory) instead of a
                         fresh Postgres database
  --database-url URL     Postgres server for that fresh database
                         (default postgres://postgres@127.0.0.1:5432/postgres)
  --venv DIR             keep LiteLLM's venv in DIR and reuse it on the next run (default: a temporary one)
  --bin-dir DIR          where gateway and mock-model are (default target/release)
  --markdown FILE        also write the report to FILE
  -h, --help             this text

Exit status: 0, or 3 when some target answered an error (the figures are then not valid).
EOF
}

concurrency=32
duration=30
slice=2
warmup=5
litellm_version=1.106.2
litellm_workers=$(nproc)
embedded=false
database_url=postgres://postgres@127.0.0.1:5432/postgres
venv=
repo=$(cd "$(dirname "$0")/.." && pwd)
bin_dir=$repo/target/release
markdown=

while [ $# -gt 0 ]; do
  case $1 in
    --concurrency) concurrency=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --slice) slice=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --litellm-version) litellm_version=$2; shift 2 ;;
    --litellm-workers) litellm_workers=$2; shift 2 ;;
    --embedded) embedded=true; shift ;;
    --database-url) database_url=$2; shift 2 ;;
    --venv) venv=$2; shift 2 ;;
    --bin-dir) bin_dir=$2; shift 2 ;;
    --markdown) markdown=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "unknown option: $1" >&2; usage >&2; exit 2 ;;
  esac
done
for n in "$concurrency" "$duration" "$slice" "$litellm_workers"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "expected a positive integer, got '$n'" >&2; exit 2; }
done
[[ $warmup =~ ^[0-9]+$ ]] || { echo "--warmup: expected an integer, got '$warmup'" >&2; exit 2; }

log() { echo "[bench-litellm] $*" >&2; }
die() { log "error: $*"; exit 1; }

cd "$repo"
for bin in gateway mock-model; do
  [ -x "$bin_dir/$bin" ] || die "$bin_dir/$bin not found; build it: cargo build --release -p gateway -p gateway-testkit"
done
command -v python3 >/dev/null || die "python3 is needed (LiteLLM runs on it)"
missing=()
for tool in wrk jq curl; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]} (Debian)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-litellm.XXXXXX")
pids=()
database=

# Every process this script starts is in `pids`; LiteLLM's workers are its children. On any exit: stop them (TERM,
# then KILL after 10 s: LiteLLM takes a few seconds to stop its workers), drop the database, remove the temporary
# directory.
descendants() {
  local child
  for child in $(pgrep -P "$1" 2>/dev/null || true); do
    descendants "$child"
    echo "$child"
  done
}
cleanup() {
  local pid victims=() alive=() _
  for pid in "${pids[@]}"; do
    mapfile -t -O "${#victims[@]}" victims < <(descendants "$pid")
    victims+=("$pid")
  done
  if [ ${#victims[@]} -gt 0 ]; then
    kill -TERM "${victims[@]}" 2>/dev/null || true
    for _ in $(seq 100); do
      alive=()
      for pid in "${victims[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
      [ ${#alive[@]} -gt 0 ] || break
      sleep 0.1
    done
    [ ${#alive[@]} -eq 0 ] || kill -KILL "${alive[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
  fi
  if [ -n "$database" ]; then
    psql -q "$database_url" -c "DROP DATABASE IF EXISTS \"$database\" WITH (FORCE)" >/dev/null 2>&1 || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

load_before=$(cut -d' ' -f1-3 /proc/loadavg)

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits up to SECONDS for COMMAND to succeed; fails early, showing the end of LOG, if PID died.
wait_for() { # SECONDS PID NAME LOG COMMAND...
  local seconds=$1 pid=$2 what=$3 log_file=$4 _
  shift 4
  for _ in $(seq $((seconds * 10))); do
    if "$@"; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$log_file" >&2
      die "$what exited during start-up"
    fi
    sleep 0.1
  done
  tail -n 30 "$log_file" >&2
  die "$what did not start within ${seconds} s"
}

# --- LiteLLM, in its own venv --------------------------------------------------------------------------------
# Installed first: it takes a minute, and it fails early if the version is not on PyPI.
if [ -z "$venv" ]; then
  venv=$tmp/venv
fi
installed=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("litellm"))' 2>/dev/null || true)
if [ "$installed" != "$litellm_version" ]; then
  log "installing litellm[proxy]==$litellm_version into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "litellm[proxy]==$litellm_version" \
    || die "could not install litellm[proxy]==$litellm_version (see: pip index versions litellm)"
fi

# --- The mock model: one process behind both proxies ---------------------------------------------------------
RUST_BACKTRACE=0 RUST_LOG=warn "$bin_dir/mock-model" --bind 127.0.0.1:0 >"$tmp/mock.out" 2>"$tmp/mock.err" &
mock_pid=$!
pids+=("$mock_pid")
wait_for 10 "$mock_pid" mock-model "$tmp/mock.err" grep -q "^listening on " "$tmp/mock.out"
mock=$(sed -n 's/^listening on //p' "$tmp/mock.out" | head -n 1)

# --- Our gateway: gateway serve, configured through the admin API as gateway-bench does ----------------------
if $embedded; then
  store_url="sqlite://$tmp/gateway.db?mode=rwc"
  store="embedded (SQLite)"
else
  command -v psql >/dev/null || die "psql is needed for a Postgres database (or use --embedded)"
  database=gw_litellm_$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
  psql -q "$database_url" -c "CREATE DATABASE \"$database\"" >/dev/null \
    || die "cannot create a database on $database_url"
  store_url=${database_url%/*}/$database
  store="Postgres (fresh database)"
fi
admin_token=admin-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
# The built-in defaults (an empty configuration file), not config/default.toml: the working tree's file may be
# ahead of or behind the binary. The rest as under gateway-bench: JSON logs (the listening line carries the
# address), warn plus the gateway's info.
echo "# bench-litellm: the gateway's built-in defaults" >"$tmp/gateway.toml"
RUST_BACKTRACE=0 GATEWAY__SERVER__BIND=127.0.0.1:0 GATEWAY__LOG__FORMAT=json GATEWAY__LOG__FILTER=warn,gateway=info \
  GATEWAY__ADMIN__TOKEN=$admin_token DATABASE_URL=$store_url \
  "$bin_dir/gateway" --config "$tmp/gateway.toml" serve >"$tmp/gateway.log" 2>&1 &
gateway_pid=$!
pids+=("$gateway_pid")
wait_for 60 "$gateway_pid" gateway "$tmp/gateway.log" grep -q "gateway listening" "$tmp/gateway.log"
gateway=http://$(jq -r 'select(.fields.message? == "gateway listening") | .fields.address' "$tmp/gateway.log" \
  2>/dev/null | head -n 1)

admin() { # METHOD PATH [JSON]: one admin call; prints the answer, fails on a non-2xx
  local args=(-sS --fail-with-body -X "$1" -H "Authorization: Bearer $admin_token")
  [ $# -gt 2 ] && args+=(-H 'Content-Type: application/json' --data "$3")
  curl "${args[@]}" "$gateway/admin/v1$2"
}
project=$(admin POST /projects '{"name": "bench-litellm"}' | jq -r .id)
key=$(admin POST "/projects/$project/api_keys" '{"name": "bench-litellm"}' | jq -r .key)
deployment=$(admin POST /deployments "$(jq -cn --arg url "$mock/v1" \
  '{name: "mock", provider: {kind: "openai_chat", base_url: $url, model: "mock-model"}}')" | jq -r .id)
group=$(admin POST /deployment_groups '{"name": "bench-litellm"}' | jq -r .id)
admin PUT "/deployment_groups/$group/deployments/$deployment" >/dev/null
admin PUT "/deployment_groups/$group/projects/$project" >/dev/null

# --- LiteLLM's proxy: one model `mock` on the same mock model, no database -----------------------------------
# A master key is required (1.106 refuses to start without one); requests carry it as our gateway's carry its key.
# use_chat_completions_api: LiteLLM turns the Responses request into a Chat Completions call, as our gateway's
# openai_chat deployment does, so that both do the same work. (Its native OpenAI Responses pass-through cannot be
# used against this mock anyway: 1.106.2 answers 500, KeyError 'created_at', on the mock's Responses answer.)
litellm_key=sk-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
litellm_port=$(free_port)
cat >"$tmp/litellm.yaml" <<EOF
model_list:
  - model_name: mock
    litellm_params:
      model: openai/mock-model
      api_base: $mock/v1
      api_key: x
      use_chat_completions_api: true
litellm_settings:
  set_verbose: false
  telemetry: false
general_settings:
  disable_spend_logs: true
EOF
# LITELLM_LOCAL_MODEL_COST_MAP: no fetch of the price map from GitHub at start-up (the machine may be offline).
LITELLM_MASTER_KEY=$litellm_key LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_LOG=ERROR \
  "$venv/bin/litellm" --config "$tmp/litellm.yaml" --host 127.0.0.1 --port "$litellm_port" \
  --num_workers "$litellm_workers" >"$tmp/litellm.log" 2>&1 &
litellm_pid=$!
pids+=("$litellm_pid")
litellm=http://127.0.0.1:$litellm_port
log "waiting for LiteLLM $litellm_version ($litellm_workers workers) on $litellm"
wait_for 180 "$litellm_pid" LiteLLM "$tmp/litellm.log" curl -sf -o /dev/null "$litellm/health/readiness"

# --- What each target is sent, and what a good answer contains -----------------------------------------------
# Targets: gateway, litellm, mock. For each: URL, body file, key, and two checks of a 2xx answer's body (a plain
# substring, and a Lua pattern) that the load generator applies to every answer.
request='{"model": "mock", "input": "Say hello", "store": false}'
echo "$request" >"$tmp/gateway.body"
echo "$request" >"$tmp/litellm.body"
declare -A url=([gateway]="$gateway/v1/responses" [litellm]="$litellm/v1/responses")
declare -A auth=([gateway]="$key" [litellm]="$litellm_key" [mock]=x)
declare -A pattern=([gateway]='"status"%s*:%s*"completed"' [litellm]='"status"%s*:%s*"completed"')
echo_text='Echo: Say hello'
notes=()

reset_mock() { curl -sS -o /dev/null -X POST "$mock/_mock/reset"; }

# One request to TARGET, its answer kept in $tmp/TARGET.answer; fails unless 2xx with the echo and the pattern.
probe() { # TARGET
  local status
  status=$(curl -sS -o "$tmp/$1.answer" -w '%{http_code}' -H "Authorization: Bearer ${auth[$1]}" \
    -H 'Content-Type: application/json' --data-binary "@$tmp/$1.body" "${url[$1]}") || return 1
  [[ $status == 2* ]] && grep -qF "$echo_text" "$tmp/$1.answer" \
    && grep -qE "${pattern[$1]//%s/[[:space:]]}" "$tmp/$1.answer"
}
# The last upstream request the mock received (its body), and which API that was.
upstream_body() { curl -sS "$mock/_mock/requests" | jq -c last; }
upstream_api() {
  jq -r 'if has("messages") then "Chat Completions" elif has("input") then "Responses" else "?" end' "$1"
}

reset_mock
probe gateway || die "our gateway answered $(head -c 400 "$tmp/gateway.answer")"
# The mock's ceiling: exactly the upstream request our gateway sent, straight to the mock.
upstream_body >"$tmp/mock.body"
gateway_upstream=$(upstream_api "$tmp/mock.body")
url[mock]=$mock/v1/chat/completions
pattern[mock]='"choices"'
probe mock || die "the mock model answered $(head -c 400 "$tmp/mock.answer")"

reset_mock
litellm_path=/v1/responses
if probe litellm; then
  upstream_body >"$tmp/litellm.upstream"
else
  # Fallback: LiteLLM cannot serve Responses against this mock; compare its Chat Completions instead.
  log "LiteLLM's /v1/responses failed: $(head -c 400 "$tmp/litellm.answer")"
  litellm_path=/v1/chat/completions
  url[litellm]=$litellm$litellm_path
  echo '{"model": "mock", "messages": [{"role": "user", "content": "Say hello"}]}' >"$tmp/litellm.body"
  pattern[litellm]='"choices"'
  reset_mock
  probe litellm || die "LiteLLM's /v1/chat/completions failed too: $(head -c 400 "$tmp/litellm.answer")"
  upstream_body >"$tmp/litellm.upstream"
  notes+=("LiteLLM could not serve \`POST /v1/responses\` against the mock; **its row is \
\`POST /v1/chat/completions\`**, against our gateway's \`/v1/responses\`.")
fi
litellm_upstream=$(upstream_api "$tmp/litellm.upstream")
if [ "$gateway_upstream" != "$litellm_upstream" ]; then
  notes+=("The two proxies called the mock differently: our gateway in $gateway_upstream, \
LiteLLM in $litellm_upstream.")
fi
reset_mock

# --- The load generator: wrk, with a Lua script that checks every answer and dumps its latency histogram -----
cat >"$tmp/check.lua" <<'EOF'
-- args: body file, bearer key, plain substring and Lua pattern a 2xx body must contain
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args)
  local f = assert(io.open(args[1], "rb"))
  wrk.method = "POST"
  wrk.body = f:read("*a")
  f:close()
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer " .. args[2]
  plain, pattern = args[3], args[4]
  non2xx, badbody = 0, 0
end
function response(status, headers, body)
  if status < 200 or status > 299 then
    non2xx = non2xx + 1
  elseif not body:find(plain, 1, true) or not body:find(pattern) then
    badbody = badbody + 1
  end
end
function done(summary, latency, requests)
  local non2xx_all, bad_all = 0, 0
  for _, t in ipairs(threads) do
    non2xx_all = non2xx_all + t:get("non2xx")
    bad_all = bad_all + t:get("badbody")
  end
  local e = summary.errors
  -- requests, measured µs, non-2xx, socket errors (connect, read, write, timeout), 2xx with a wrong body
  io.write(string.format("SUMMARY %d %d %d %d %d\n", summary.requests, summary.duration, non2xx_all,
    e.connect + e.read + e.write + e.timeout, bad_all))
  -- the latency histogram (µs, count), so that slices can be merged into exact percentiles
  for i = 1, #latency do
    local value, count = latency(i)
    io.write(string.format("LAT %d %d\n", value, count))
  end
end
EOF
threads=$(( $(nproc) < concurrency ? $(nproc) : concurrency ))
clk_tck=$(getconf CLK_TCK)

# CPU ticks (user + system) of a process and its descendants (LiteLLM's workers).
tree_ticks() {
  local pid total=0 stat fields
  for pid in "$1" $(descendants "$1"); do
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    read -r -a fields <<<"${stat##*) }"
    total=$((total + fields[11] + fields[12]))
  done
  echo "$total"
}
declare -A proc_pid=([gateway]=$gateway_pid [litellm]=$litellm_pid [mock]=$mock_pid)
declare -A ticks=([gateway]=0 [litellm]=0 [mock]=0)

run() { # TARGET SECONDS OUTFILE: one closed-loop run; CPU ticks of the target's process are added up
  local before
  before=$(tree_ticks "${proc_pid[$1]}")
  wrk -t "$threads" -c "$concurrency" -d "${2}s" --timeout 30s -s "$tmp/check.lua" "${url[$1]}" \
    -- "$tmp/$1.body" "${auth[$1]}" "$echo_text" "${pattern[$1]}" >"$3"
  ticks[$1]=$(( ticks[$1] + $(tree_ticks "${proc_pid[$1]}") - before ))
  reset_mock # the mock records every request; keep that list short
}

if [ "$warmup" -gt 0 ]; then
  log "warm-up: ${warmup} s per target"
  for target in gateway litellm mock; do run "$target" "$warmup" /dev/null; done
  ticks=([gateway]=0 [litellm]=0 [mock]=0)
fi

# --- Measurement: slices, the two proxies taking turns at going first, the mock last --------------------------
mkdir -p "$tmp/runs"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u '+%Y-%m-%d %H:%M UTC')
left=$duration index=0
log "measuring: ${duration} s per target in ${slice} s slices, ${concurrency} connections"
while [ "$left" -gt 0 ]; do
  seconds=$((left < slice ? left : slice))
  if [ $((index % 2)) -eq 0 ]; then order=(gateway litellm mock); else order=(litellm gateway mock); fi
  for target in "${order[@]}"; do run "$target" "$seconds" "$tmp/runs/$target.$index"; done
  left=$((left - seconds)) index=$((index + 1))
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# --- Report -----------------------------------------------------------------------------------------------------
# Prints: requests, req/s, p50 ms, p99 ms, non-2xx, socket errors, wrong bodies, CPU µs per request.
summarise() { # TARGET
  local totals
  totals=$(cat "$tmp/runs/$1".* | awk '$1 == "SUMMARY" { r += $2; us += $3; n += $4; s += $5; b += $6 }
    END { printf "%d %d %d %d %d", r, us, n, s, b }')
  read -r requests micros non2xx socket bad <<<"$totals"
  cat "$tmp/runs/$1".* | awk '$1 == "LAT" { print $2, $3 }' | sort -n -k1,1 \
    | awk -v r="$requests" -v us="$micros" -v n="$non2xx" -v s="$socket" -v b="$bad" \
      -v ticks="${ticks[$1]}" -v hz="$clk_tck" '
      { value[NR] = $1; count[NR] = $2; total += $2 }
      END {
        for (i = 1; i <= NR; i++) {
          seen += count[i]
          if (p50 == "" && seen >= 0.50 * total) p50 = value[i]
          if (p99 == "" && seen >= 0.99 * total) p99 = value[i]
        }
        printf "%d %.0f %.2f %.2f %d %d %d %.0f\n", r, r / (us / 1e6), p50 / 1000, p99 / 1000, n, s, b,
          (r > 0 ? ticks * 1e6 / hz / r : 0)
      }'
}
declare -A row
for target in gateway litellm mock; do row[$target]=$(summarise "$target"); done
read -r _ gateway_rps gateway_p50 _ <<<"${row[gateway]}"
read -r _ litellm_rps litellm_p50 _ <<<"${row[litellm]}"
ratio=$(awk -v a="$gateway_rps" -v b="$litellm_rps" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }')
latency_ratio=$(awk -v a="$litellm_p50" -v b="$gateway_p50" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }')

# The binary may have been built from another state than the checkout (a shared target directory): say both.
binary_built=$(date -u -r "$bin_dir/gateway" '+%Y-%m-%d %H:%M UTC')
checkout=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')
if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  checkout="$checkout + uncommitted changes"
fi
errors=0
{
  echo "### Our gateway against LiteLLM $litellm_version, $started"
  echo
  echo "\`scripts/bench-litellm.sh --concurrency $concurrency --duration $duration --slice $slice --warmup $warmup" \
    "--litellm-version $litellm_version --litellm-workers $litellm_workers$($embedded && echo ' --embedded')\`"
  echo
  echo "* Machine: $(nproc) cores ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)); load average" \
    "(1, 5, 15 min) before set-up $load_before, at the start of measurement **$load_start**, at the end **$load_end**."
  echo "* Our gateway: \`$bin_dir/gateway\` (built $binary_built; the checkout is at \`$checkout\`), store:" \
    "$store, a deployment \`mock\` of kind \`openai_chat\`; upstream calls in $gateway_upstream:" \
    "\`$(cat "$tmp/mock.body")\`."
  python_version=$("$venv/bin/python" -c 'import platform; print(platform.python_version())')
  echo "* LiteLLM: \`litellm[proxy]==$litellm_version\` (Python $python_version), $litellm_workers uvicorn worker(s), no" \
    "database, a master key, model \`openai/mock-model\` with \`use_chat_completions_api: true\`; upstream calls in" \
    "$litellm_upstream: \`$(cat "$tmp/litellm.upstream")\`."
  echo "* Load: \`$(wrk --version 2>&1 | head -n 1 | cut -d' ' -f1-2)\`, $concurrency connections ($threads threads)," \
    "closed loop, $duration s per target after $warmup s of warm-up, in $slice s slices (gateway and LiteLLM taking" \
    "turns at going first, the mock last). Request: \`POST /v1/responses\` \`$request\`; the mock row is our" \
    "gateway's upstream request sent to the mock itself."
  for note in "${notes[@]}"; do echo "* $note"; done
  echo
  echo "| target | req/s | p50 ms | p99 ms | requests | errors (non-2xx / socket / wrong body) | CPU µs/req |"
  echo "|---|--:|--:|--:|--:|--:|--:|"
  for target in gateway litellm mock; do
    read -r requests rps p50 p99 non2xx socket bad cpu <<<"${row[$target]}"
    case $target in
      gateway) name="our gateway \`/v1/responses\`" ;;
      litellm) name="LiteLLM \`$litellm_path\`" ;;
      mock) name="mock model directly (ceiling)" ;;
    esac
    errors=$((errors + non2xx + socket + bad))
    echo "| $name | $rps | $p50 | $p99 | $requests | $((non2xx + socket + bad)) ($non2xx / $socket / $bad) | $cpu |"
  done
  echo
  echo "**Gateway ÷ LiteLLM: ${ratio}× the requests per second**; LiteLLM's p50 is ${latency_ratio}× ours." \
    "CPU µs/req is the proxy's own process (LiteLLM: with its workers), or the mock's for its row."
  if [ "$errors" -gt 0 ]; then
    echo
    echo "**Not a valid figure: $errors requests failed.**"
  fi
  # Before set-up shows other work; at the start of measurement, also LiteLLM's start-up and the warm-up. The end
  # includes this bench's own load (all targets saturate the cores), so it is not a sign of other work.
  if awk -v a="${load_before%% *}" -v b="${load_start%% *}" 'BEGIN { exit !(a > 1.5 || b > 1.5) }'; then
    echo
    echo "The load average was above 1.5 before or at the start: other work shared the cores, so the figures are" \
      "only indicative."
  fi
} >"$tmp/report.md"
cat "$tmp/report.md"
[ -z "$markdown" ] || cp "$tmp/report.md" "$markdown"
gateway_problems=$(grep -c '"level":"\(WARN\|ERROR\)"' "$tmp/gateway.log" || true)
[ "$gateway_problems" -eq 0 ] || log "our gateway logged $gateway_problems warnings or errors"
[ "$errors" -eq 0 ] || exit 3
