#!/usr/bin/env bash
# The verbs benchmark on real rdma-core: `rdma-tool bench data --provider verbs` next to
# perftest on the same SoftRoCE device, inside the qemu guest, repeated RUNS times (the guest
# is emulated and noisy: report medians over the runs), then the engine benchmarks (async
# latency per progress mode, list vs single doorbell, 1/2/4 CQs) on the same device.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
cargo build --release -q -p rdma-tool
tool=$PWD/target/release/rdma-tool
exec scripts/softroce/run-in-guest.sh --timeout "${VERBS_BENCH_TIMEOUT:-900}" --copy "$tool" -- \
  sh -c "for i in \$(seq $runs); do echo \"=== run \$i\"; $tool bench data --provider verbs --op write,read --size 8,64K --iters 5000 || exit 1; \
    $tool bench data --provider verbs --async --batch 16,64 --cqs 1,2,4 --iters 2000 --count 20000 || exit 1; done"
