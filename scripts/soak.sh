#!/usr/bin/env bash
# Soak (not in CI): SOAK_MINUTES (default 20) of mixed work on the soft provider over TCP on
# loopback, with `rdma-tool stress` (registration churn through the registrar) in a loop
# beside it. The soak example samples itself every 5 s (RSS, pinned bytes, open fds,
# threads, live QPs and regions, operations, errors, latency p50/p99) into a CSV; then a
# plot and a verdict (first quarter against last quarter, slopes) are written next to it.
#
#   SOAK_MINUTES=10 scripts/soak.sh        # results in docs/soak/ (SOAK_OUT to change)
#
# Plotting uses matplotlib in a venv under target/soak-venv (made on first use, from PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${SOAK_MINUTES:-20}
out=${SOAK_OUT:-docs/soak}
interval=${SOAK_INTERVAL:-5}
secs=$((minutes * 60))
mkdir -p "$out"

cargo build --release -q -p rdmapool --example soak
cargo build --release -q -p rdma-tool

echo "== soak: ${minutes} min, sampling every ${interval} s, into $out"
: >"$out/stress.jsonl"
(
  end=$((SECONDS + secs))
  while [ "$SECONDS" -lt "$end" ]; do
    if ! target/release/rdma-tool stress --size 32M --count 40 --threads 2 --json \
      >>"$out/stress.jsonl" 2>>"$out/stress.err"; then
      echo '{"failed_run": true}' >>"$out/stress.jsonl"
    fi
  done
) &
stress=$!
trap 'kill "$stress" 2>/dev/null || true' EXIT

status=0
RDMAPOOL_SOFT_TRANSPORT=tcp target/release/examples/soak "$secs" "$interval" \
  >"$out/soak.csv" 2>"$out/soak.err" || status=$?
wait "$stress" || true
trap - EXIT
tail -n 1 "$out/soak.err" || true

venv=target/soak-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q matplotlib
fi
"$venv/bin/python" scripts/soak_plot.py "$out/soak.csv" "$out/stress.jsonl" "$out/soak.png" |
  tee "$out/summary.txt"
rm -f "$out/stress.err" "$out/soak.err"
exit "$status"
