#!/usr/bin/env bash
# The Python package (crates/rdmapool-py, issue #45), as a new user gets it: the README's
# `pip install ./crates/rdmapool-py` into a fresh venv, the wheel checked to link nothing
# beyond glibc (rdma-core stays dlopen'ed) and to be one abi3 wheel, then the pytest suite
# (which runs examples/python/kv_pages.py too) and a short run of `python -m rdmapool.bench`.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/py-venv
rm -rf "$venv"
python3 -m venv "$venv"
pip=("$venv/bin/pip" --disable-pip-version-check -q)
"${pip[@]}" install pytest numpy redis auditwheel

echo "-- pip install ./crates/rdmapool-py (the README's command)"
"${pip[@]}" install ./crates/rdmapool-py

echo "-- the wheel: one abi3 wheel, linking glibc and libgcc_s only"
rm -rf target/wheels
"${pip[@]}" wheel --no-deps -w target/wheels ./crates/rdmapool-py
wheel=$(ls target/wheels/rdmapool-*.whl)
echo "$wheel"
case "$wheel" in
  *-cp311-abi3-*) ;;
  *) echo "not an abi3 wheel for CPython >= 3.11: $wheel" >&2; exit 1 ;;
esac
"$venv/bin/auditwheel" show "$wheel"
so=$("$venv/bin/python" -c 'import rdmapool._rdmapool as m; print(m.__file__)')
ldd "$so"
extra=$(ldd "$so" | awk '{print $1}' | grep -Ev '^(linux-vdso\.so\.1|libc\.so\.6|libm\.so\.6|libgcc_s\.so\.1|/lib64/ld-linux-x86-64\.so\.2|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1)$' || true)
if [ -n "$extra" ]; then
  echo "the extension links more than glibc: $extra" >&2
  exit 1
fi

echo "-- pytest"
(cd crates/rdmapool-py && "../../$venv/bin/python" -m pytest -q tests)

echo "-- the examples in the package's docstrings"
(cd target && "../$venv/bin/python" -m pytest -q -p no:cacheprovider --doctest-modules --pyargs rdmapool)

echo "-- python -m rdmapool.bench, briefly (figures come from quiet runs: docs/BENCHMARKS.md)"
"$venv/bin/python" -m rdmapool.bench --seconds 0.1 --repeat 1 --server-size $((256 << 20)) --json
