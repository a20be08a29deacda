#!/usr/bin/env bash
# Every file or directory path that README.md, CHANGELOG.md and docs/*.md name must exist.
#
# A path is a whole word with at least one slash that ends in a file extension kept in this
# repository (.rs .md .sh .c .py .json .toml .txt .yml .ttf) or in a slash (a directory):
# `crates/rdmapool-pool/src/conn/tcp.rs`, `scripts/c-peer/cm_peer.c`, `docs/PROTOCOL.md`,
# `soft/proto/`. The docs also name files by their tail (`conn/private.rs` in a section about
# rdmapool's source, `tests/it/faults.rs`, `engine/mod.rs` under `cq/` in a tree), so a path is
# found when it is a file or directory of the repository or its tail at a slash:
# `soft/proto/wire.rs` is found (crates/rdmapool-soft/src/proto/wire.rs), `soft/wire.rs` is
# not. A path starting with ./ or ../ is taken relative to the document. Skipped: URLs,
# absolute paths (/proc/..., /etc/...), build output (target/...), and words with a
# placeholder (<, >, *, ..., $). A `#anchor` after a path is ignored.
#
# The repository's files are those git knows of, tracked or new (not ignored).
# Prints each missing path as FILE:LINE: PATH and exits 1 if there is any; exits 0 otherwise.
# Usage: scripts/check-doc-paths.sh [FILE.md ...]   (default: README.md CHANGELOG.md docs/*.md)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$#" -gt 0 ]; then
  docs=("$@")
else
  docs=(README.md docs/*.md)
  if [ -f CHANGELOG.md ]; then
    docs+=(CHANGELOG.md)
  fi
fi

# Every tail (at a slash) of every file and directory: crates/a/b.rs gives crates/a/b.rs,
# a/b.rs, b.rs, crates/a/ and a/.
tails=$(mktemp)
trap 'rm -f "$tails"' EXIT
git ls-files --cached --others --exclude-standard | awk '{
  n = split($0, part, "/")
  for (i = 1; i <= n; i++) {
    s = part[i]
    for (j = i + 1; j <= n; j++) s = s "/" part[j]
    print s
    d = ""
    for (j = i; j < n; j++) { d = d part[j] "/"; print d }
  }
}' | sort -u >"$tails"

exts='rs|md|sh|c|py|json|toml|txt|yml|ttf'
word='[A-Za-z0-9_.@<>*$…-]'
pattern="(?<![A-Za-z0-9_./-])(?:$word|/)*$word/(?:$word|/)*(?:\.(?:$exts)|/)(?![A-Za-z0-9_/])"
missing=0
checked=0

for doc in "${docs[@]}"; do
  if [ ! -f "$doc" ]; then
    echo "$doc: no such document" >&2
    missing=$((missing + 1))
    continue
  fi
  doc_dir=$(dirname "$doc")
  # line:path pairs; URLs are removed first so that their paths are not taken for ours.
  while IFS=: read -r line path; do
    case "$path" in
      /* | target/* | *'<'* | *'>'* | *'*'* | *'...'* | *'$'* | *'…'*) continue ;;
      ./* | ../*)
        # Relative to the document (a trailing slash, saying it is a directory, is kept).
        case "$path" in */) slash=/ ;; *) slash= ;; esac
        path=$(realpath -m --relative-to=. "$doc_dir/$path")$slash
        ;;
    esac
    checked=$((checked + 1))
    if ! grep -Fxq -- "$path" "$tails"; then
      echo "$doc:$line: $path"
      missing=$((missing + 1))
    fi
  done < <(sed -E 's#[A-Za-z][A-Za-z0-9+.-]*://[^[:space:])>`"]*##g' "$doc" |
    grep -noP "$pattern")
done

if [ "$missing" -gt 0 ]; then
  echo "$missing path(s) named in the docs do not exist (of $checked checked)" >&2
  exit 1
fi
echo "all $checked paths named in ${#docs[@]} documents exist"
