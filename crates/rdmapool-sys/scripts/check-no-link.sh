#!/usr/bin/env bash
# Asserts that release binaries built on rdmapool-sys do not link libibverbs or librdmacm
# (rdma-core is opened at run time with dlopen, so the binaries must start without it).
#
# Usage: crates/rdmapool-sys/scripts/check-no-link.sh [BINARY...]
#   Builds the `probe` example in release mode and checks it, runs it (it must exit 0 with or
#   without rdma-core), then checks each BINARY given (e.g. target/release/rdma-tool).
# Exit status: 0 if no binary links them, 1 otherwise.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
target_dir=${CARGO_TARGET_DIR:-$root/target}

cargo build --release -q -j1 -p rdmapool-sys --example probe
probe=$target_dir/release/examples/probe

status=0
check() {
  local bin=$1 out
  if [[ ! -x $bin ]]; then
    echo "FAIL: $bin: not an executable" >&2
    status=1
    return
  fi
  out=$(ldd "$bin" 2>&1 || true)
  if grep -Eq 'lib(ibverbs|rdmacm)' <<<"$out"; then
    echo "FAIL: $bin links rdma-core:" >&2
    grep -E 'lib(ibverbs|rdmacm)' <<<"$out" >&2
    status=1
  elif command -v readelf >/dev/null && readelf -d --wide "$bin" | grep -Eq 'NEEDED.*lib(ibverbs|rdmacm)'; then
    echo "FAIL: $bin has a DT_NEEDED on rdma-core" >&2
    status=1
  else
    echo "ok: $bin does not link libibverbs/librdmacm"
  fi
}

check "$probe"
echo "--- probe output:"
"$probe" || { echo "FAIL: probe exited $?" >&2; status=1; }
for bin in "$@"; do
  check "$bin"
done
exit $status
