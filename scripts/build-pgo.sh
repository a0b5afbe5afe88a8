#!/usr/bin/env bash
# Builds the gateway with profile-guided optimisation on top of the `dist` profile (fat LTO), as measured in
# docs/performance.md ("Fast (issue 27), sixteenth step"): an instrumented build serves the project's own bench
# (every scenario on Postgres, the fixed-rate ones, and the embedded store), its profile is merged, and the
# gateway is built again with it. The binary lands in OUT_DIR (default target/pgo).
#
# Needs what the bench needs (the local Postgres) and rustup's `llvm-tools`, whose `llvm-profdata` matches
# rustc's LLVM (Debian's does not); it is added when missing. Takes about three release builds' time.
#
#   scripts/build-pgo.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
out="${1:-target/pgo}"

sysroot="$(rustc --print sysroot)"
profdata="$(find "$sysroot" -name llvm-profdata -type f | head -n 1)"
if [ -z "$profdata" ]; then
  rustup component add llvm-tools
  profdata="$(find "$sysroot" -name llvm-profdata -type f | head -n 1)"
fi

# Fixed paths, so that a second run rebuilds only what changed.
raw="$root/target/pgo-profiles/raw"
bin="$root/target/pgo-profiles/bin"
rm -rf "$raw" "$bin"
mkdir -p "$raw" "$bin" "$out"

# The bench and the servers it drives, as usual; the gateway it drives, instrumented (in a target dir of its
# own: other flags rebuild every crate).
cargo build --release --locked -p gateway-bench -p gateway-testkit
for name in gateway-bench mock-model example-tools example-mcp; do
  cp "target/release/$name" "$bin/"
done
CARGO_TARGET_DIR=target/pgo-generate RUSTFLAGS="-Cprofile-generate=$raw" \
  cargo build --release --locked -p gateway --bin gateway
cp target/pgo-generate/release/gateway "$bin/"

# The training: what the gateway does in production, in the proportions the bench gives it. The bench stops the
# gateway with SIGTERM, so that it writes its profile as it exits.
"$bin/gateway-bench" --bin-dir "$bin" --scenario all --duration 4 --warmup 1 --streams 200 --stream-hold-ms 500 \
  >/dev/null
"$bin/gateway-bench" --bin-dir "$bin" --scenario text-unstored,text-stored --rate 500 --duration 4 --warmup 1 \
  >/dev/null
"$bin/gateway-bench" --bin-dir "$bin" --embedded --scenario text-stored,tool-round --duration 4 --warmup 1 \
  >/dev/null
if ! ls "$raw"/*.profraw >/dev/null 2>&1; then
  echo "the instrumented gateway wrote no profile" >&2
  exit 1
fi
merged="$root/target/pgo-profiles/merged.profdata"
"$profdata" merge -o "$merged" "$raw"
# Named by its content: cargo sees a new profile as new flags, and rebuilds with it.
digest="$(sha256sum "$merged" | cut -c1-16)"
profile="$root/target/pgo-profiles/gateway-$digest.profdata"
mv "$merged" "$profile"

CARGO_TARGET_DIR=target/pgo-use RUSTFLAGS="-Cprofile-use=$profile" \
  cargo build --profile dist --locked -p gateway --bin gateway
cp target/pgo-use/dist/gateway "$out/gateway"
echo "built $out/gateway"
