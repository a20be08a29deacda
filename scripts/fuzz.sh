#!/usr/bin/env bash
# Fuzzes rdmapool's wire decoders and soft protocol state machines (fuzz/: cargo-fuzz,
# libFuzzer): every target for FUZZ_SECONDS seconds (default 60), starting from the committed
# corpus in fuzz/corpus/<target>. Fails if any target crashes (a panic, an AddressSanitizer
# report, a leak, an input running over 10 s); prints each target's executions.
#
# Stable Rust is enough: cargo-fuzz passes nightly-only flags (-Zsanitizer=address, the
# sanitizer-coverage options), which a stable rustc accepts with RUSTC_BOOTSTRAP=1; the
# sanitizer runtimes ship with stable's rust-std.
#
# Environment:
#   FUZZ_SECONDS    seconds per target (default 60)
#   FUZZ_TARGETS    space-separated targets (default: all, as `cargo fuzz list` prints them)
#   FUZZ_SANITIZER  address (default) or none
#   FUZZ_KEEP       a directory: the new inputs each target found are kept in FUZZ_KEEP/<target>
#                   (default: a temporary directory, removed; the committed corpus is never
#                   written, see docs/RELIABILITY.md for how it was grown)
# A crash leaves its input in fuzz/artifacts/<target>/; the script prints how to replay it.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-60}
sanitizer=${FUZZ_SANITIZER:-address}
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi
cargo fuzz --version

targets=${FUZZ_TARGETS:-$(cargo fuzz list --fuzz-dir fuzz)}
if [ -n "${FUZZ_KEEP:-}" ]; then
  work=$FUZZ_KEEP
  mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi

echo "== building the targets (sanitizer: $sanitizer)"
cargo fuzz build --fuzz-dir fuzz -s "$sanitizer"

failed=()
summary=()
for t in $targets; do
  echo "== fuzzing $t for ${seconds}s"
  mkdir -p "$work/$t"
  log="$work/$t.log"
  # The first corpus directory receives what the run finds; the committed one is only read.
  rc=0
  cargo fuzz run --fuzz-dir fuzz -s "$sanitizer" "$t" "$work/$t" "fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -timeout=10 -print_final_stats=1 >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  found=$(find "$work/$t" -type f | wc -l)
  line=$(printf '%-16s executions %10s  exec/s %6s  edges %5s  new inputs %5s' \
    "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "$found")
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    line="$line  FAILED (exit $rc)"
    tail -n 60 "$log"
    artifact=$(grep -o 'fuzz/artifacts/[^ ]*' "$log" | tail -1 || true)
    if [ -n "$artifact" ]; then
      echo "replay: RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir fuzz $t $artifact"
    fi
  fi
  echo "$line"
  summary+=("$line")
done

echo "== fuzzing summary (${seconds}s per target)"
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "crashed: ${failed[*]}" >&2
  exit 1
fi
