#!/usr/bin/env bash
# Packages every workspace crate and builds each from its own tarball (`cargo package
# --workspace`), as crates.io would.
#
# Why not just run cargo: to build a crate against its sibling's tarball, cargo puts the
# tarballs in a local registry at target/package/tmp-registry, unpacks them under
# $CARGO_HOME/registry/src/-<hash of that path>/<name>-<version> and builds them into
# target/debug. Cargo takes a registry crate to be immutable: it unpacks one only once per name,
# version and registry path, and it reuses its build when the name, version and source match,
# without looking at the files. So when a CI machine reuses the checkout path, CARGO_HOME or
# target directory, a later run that packages new sources under the same version is verified
# against the old ones. That failed a CI run: rdma-tool was built against an rdmapool from an
# earlier commit, which lacked a function the new one has (reproduced by packaging f7853ac in a
# checkout that had packaged 5a2d7ac). So this first removes this workspace's crates, and only
# them, from both places: their unpacked copies in path-hashed sources ("-*"; crates.io's own
# "index.crates.io-*" is never touched) and their build fingerprints, which makes cargo rebuild
# them (and what depends on them) from the tarballs.
set -euo pipefail
cd "$(dirname "$0")/.."

registry_src="${CARGO_HOME:-$HOME/.cargo}/registry/src"
metadata=$(cargo metadata --no-deps --format-version 1)
target_dir=$(echo "$metadata" | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
names=$(echo "$metadata" | python3 -c 'import json, sys
for p in json.load(sys.stdin)["packages"]:
    print(p["name"] + " " + p["version"])')

removed=0
while read -r name version; do
  for stale in "$registry_src"/-*/"$name-$version" \
    "$target_dir"/debug/.fingerprint/"$name"-????????????????; do
    if [ -d "$stale" ]; then
      rm -rf -- "$stale"
      removed=$((removed + 1))
    fi
  done
done <<<"$names"
echo "removed $removed earlier unpacked copies and build fingerprints of this workspace's crates"

# rdmapool-py is not published to crates.io (publish = false): it ships as a Python wheel,
# which scripts/python-check.sh builds and checks.
cargo package --workspace --exclude rdmapool-py "$@"
