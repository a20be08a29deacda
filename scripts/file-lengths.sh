#!/usr/bin/env bash
# The sanity bound on file length (docs/ARCHITECTURE.md, "Rules the tree keeps": a file is a concept): no Rust file
# of the workspace passes MAX_LINES lines (1 200), bindgen's output excepted. Prints the
# longest files and exits 1 naming any over the bound.
set -euo pipefail
cd "$(dirname "$0")/.."
max=${MAX_LINES:-1200}
over=0
while read -r lines file; do
  [ "$file" = total ] && continue
  case $file in */bindings.rs) continue ;; esac
  if [ "$lines" -gt "$max" ]; then
    echo "over $max lines: $file ($lines)" >&2
    over=1
  fi
done < <(git ls-files '*.rs' | xargs wc -l | sort -rn)
git ls-files '*.rs' | grep -v '/bindings.rs$' | xargs wc -l | sort -rn | sed -n '2,4p' | sed 's/^/longest: /'
exit "$over"
