#!/usr/bin/env bash
# A flame graph of the gateway under the bench (issue 27): `perf` samples the gateway process at 499 Hz with DWARF
# call graphs while `gateway-bench` drives one scenario in a closed loop; inferno folds and draws the stacks.
# Frames are shortened before drawing (generic parameters, symbol hashes and the frames tokio and std put under
# every task poll are dropped) so that the graph reads by function and stays small.
#
# Needs the release build (cargo build --release -p gateway -p gateway-testkit -p gateway-bench), perf
# (linux-perf, installed with apt-get when missing), python3, Postgres on 127.0.0.1:5432, and inferno (installed
# from crates.io into a throw-away directory when missing: it is never a project dependency).
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/flamegraph.sh [options] OUT.svg

  --bin-dir DIR        where gateway, gateway-bench and the testkit servers are (default target/release)
  --scenario NAME      the bench scenario (default text-unstored)
  --concurrency N      closed-loop workers (default 64)
  --seconds S          seconds sampled, from 6 s after the gateway is ready (default 6)
  --title TEXT         the graph's title
  --folded FILE        also keep the shortened folded stacks in FILE
  -h, --help           this text
EOF
}

bin_dir=target/release
scenario=text-unstored
concurrency=64
seconds=6
title=""
folded_out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --scenario) scenario=$2; shift 2 ;;
    --concurrency) concurrency=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --title) title=$2; shift 2 ;;
    --folded) folded_out=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
    *) break ;;
  esac
done
[[ $# -eq 1 ]] || { usage >&2; exit 2; }
out=$1
title=${title:-"gateway, $scenario, c=$concurrency"}

if ! command -v perf >/dev/null; then
  apt-get install -y -q linux-perf >/dev/null
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
inferno=$(command -v inferno-flamegraph || true)
if [[ -z $inferno ]]; then
  cargo install --quiet --locked inferno --root "$work/inferno" >&2
  inferno="$work/inferno/bin/inferno-flamegraph"
fi
collapse="$(dirname "$inferno")/inferno-collapse-perf"

duration=$((seconds + 14))
"$bin_dir/gateway-bench" --bin-dir "$bin_dir" --scenario "$scenario" --concurrency "$concurrency" \
  --duration "$duration" --slice 0 --warmup 3 >"$work/bench.txt" 2>"$work/bench.log" &
bench=$!
# The bench starts its own gateway and names its pid once it is ready; sample it once it is under load.
pid=""
for _ in $(seq 1 600); do
  pid=$(sed -n 's/^\[bench\] gateway .* (pid \([0-9]*\)).*/\1/p' "$work/bench.log" | head -1)
  [[ -n $pid ]] && break
  kill -0 "$bench" 2>/dev/null || break
  sleep 0.1
done
[[ -n $pid ]] || { echo "the bench started no gateway" >&2; cat "$work/bench.log" >&2; exit 1; }
sleep 6
perf record -F 499 -g --call-graph dwarf,32768 -p "$pid" -o "$work/perf.data" -- sleep "$seconds" 2>"$work/perf.log" || { cat "$work/perf.log" >&2; exit 1; }
wait "$bench"
perf script -i "$work/perf.data" 2>/dev/null | "$collapse" >"$work/full.folded"
python3 - "$work/full.folded" "$work/short.folded" <<'EOF'
import collections, re, sys

def shorten(frame):
    frame = re.sub(r"::h[0-9a-f]{16}$", "", frame)
    previous = None
    while previous != frame:
        previous = frame
        frame = re.sub(r"<[^<>]*>", lambda m: m.group(0) if m.start() == 0 and " as " in m.group(0) else "", frame)
    frame = re.sub(r"\{\{closure\}\}|\{closure#\d+\}|\{async_fn#\d+\}|\{async_block#\d+\}", "{closure}", frame)
    return frame[:120]

runner = re.compile(r"^(catch_unwind|do_call|call_once|with_mut|__rust_try|std::panicking::|std::panic::)")
stacks = collections.Counter()
for line in open(sys.argv[1]):
    stack, count = line.rsplit(" ", 1)
    frames = [shorten(f) for f in stack.split(";")]
    # Every task's stack starts with the same worker loop: keep the thread's name and start at the task's poll.
    for i, frame in enumerate(frames):
        if "poll_future" in frame:
            frames = frames[:1] + frames[i + 1:]
            break
    stacks[";".join(f for f in frames if not runner.match(f))] += int(count)
with open(sys.argv[2], "w") as out:
    for stack, count in stacks.items():
        out.write(f"{stack} {count}\n")
EOF
"$inferno" --minwidth 1.2 --title "$title" <"$work/short.folded" >"$out"
[[ -z $folded_out ]] || cp "$work/short.folded" "$folded_out"
grep -E '^\| '"$scenario"' ' "$work/bench.txt" | head -1 || true
echo "wrote $out"
