#!/usr/bin/env bash
# Runs the provider-independent test suite of crates/rdmapool on REAL rdma-core verbs:
# builds the test binaries here, then runs them inside the SoftRoCE qemu guest
# (scripts/softroce/run-in-guest.sh) with RDMAPOOL_TEST_PROVIDER=verbs. Exits non-zero when
# any test fails. Tests that check soft-provider-only behaviour say so and return.
set -euo pipefail
cd "$(dirname "$0")/.."

# The whole suite took 499 s in the guest at 431f225 (TCG emulation; 759 s at e6934bd, 1013
# s before the cache tests were made lighter on verbs, 1026 s on a noisy CI machine at
# f5cf96e): 1200 leaves room.
timeout_secs=${VERBS_CONFORMANCE_TIMEOUT:-1200}

# The C peer (tests/it/interop.rs): rdma-core's librdmacm/libibverbs headers and gcc.
need=()
command -v gcc >/dev/null 2>&1 || need+=(gcc)
[ -f /usr/include/rdma/rdma_verbs.h ] || need+=(librdmacm-dev)
[ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
if [ "${#need[@]}" -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
mkdir -p target/c-peer
c_peer=$PWD/target/c-peer/cm_peer
gcc -O2 -Wall -Wextra -Werror -o "$c_peer" scripts/c-peer/cm_peer.c -lrdmacm -libverbs

bins=()
while IFS= read -r bin; do
  bins+=("$bin")
done < <(cargo test -p rdmapool --tests --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])
')
if [ "${#bins[@]}" -eq 0 ]; then
  echo "verbs-conformance: no test binaries were built" >&2
  exit 1
fi

# The memory-tour example (connect, window export, READs into pooled and owned buffers) runs
# on verbs too.
cargo build -q -p rdmapool --example memory_tour
tour=$PWD/target/debug/examples/memory_tour
# The tool's demo (two processes: WRITE, READ, CAS, FAA, every result checked) on verbs.
cargo build -q -p rdma-tool
tool=$PWD/target/debug/rdma-tool

runner=$(mktemp /tmp/verbs-conformance-XXXXXX.sh)
trap 'rm -f "$runner"' EXIT
cat >"$runner" <<'INNER'
#!/bin/sh
# Inside the guest: run each test binary on the verbs provider; count the failures.
fails=0
for b in "$@"; do
  echo "=== $(basename "$b")"
  # The pool servers of the tests listen on the guest's RDMA address without a cluster key:
  # a private VM, so by the explicit opt-in (docs/SECURITY.md, secure by default).
  # Each test's time is printed beside its result (libtest's --report-time, which takes
  # RUSTC_BOOTSTRAP=1 on a stable toolchain): what a slow guest run spent its time on.
  RDMAPOOL_TEST_PROVIDER=verbs RDMAPOOL_TEST_CM_IP="$SOFTROCE_IP" RUST_BACKTRACE=0 \
    RDMAPOOL_ALLOW_UNAUTHENTICATED=1 RUSTC_BOOTSTRAP=1 \
    RDMAPOOL_C_PEER="$C_PEER" "$b" --test-threads=1 -Z unstable-options --report-time ||
    fails=$((fails + 1))
done
echo "=== example memory_tour"
"$TOUR" verbs "$SOFTROCE_IP" || fails=$((fails + 1))
echo "=== rdma-tool demo --provider verbs"
"$TOOL" demo --provider verbs || fails=$((fails + 1))
echo "verbs conformance: $fails failing of $# test binaries, 1 example and the demo"
exit "$fails"
INNER
chmod +x "$runner"

# The guest's root file system is its initramfs, in its RAM (2 GiB): copies without debug
# info (a test binary goes from ~33 MB to a few), or many test binaries no longer unpack
# ("Initramfs unpacking failed: write error", a kernel panic). Backtraces keep their symbols.
stage=$PWD/target/verbs-conformance
rm -rf "$stage"
mkdir -p "$stage"
stripped() {
  local out
  out=$stage/$(basename "$1")
  objcopy --strip-debug "$1" "$out"
  echo "$out"
}
tour=$(stripped "$tour")
tool=$(stripped "$tool")
guest_bins=()
for b in "${bins[@]}"; do
  guest_bins+=("$(stripped "$b")")
done
echo "verbs-conformance: ${#guest_bins[@]} test binaries, $(du -sh "$stage" | cut -f1) without debug info"

copies=(--copy "$runner" --copy "$c_peer" --env "C_PEER=$c_peer" --copy "$tour" --env "TOUR=$tour"
  --copy "$tool" --env "TOOL=$tool")
for b in "${guest_bins[@]}"; do
  copies+=(--copy "$b")
done
exec scripts/softroce/run-in-guest.sh --timeout "$timeout_secs" "${copies[@]}" -- "$runner" "${guest_bins[@]}"
