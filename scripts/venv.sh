#!/usr/bin/env bash
# The project's Python environment: creates .venv (ignored by git) with the first python3 on PATH
# (3.10 or newer) and installs requirements/SET.txt into it, pinned. A second run reuses it: pip
# runs again only when the requirements file changed since the last install.
# Usage: scripts/venv.sh [test|bench]   (bench = test + PyTorch 2.13 CPU for the peers)
# Afterwards .venv/bin/python is the interpreter the tests and benchmarks use.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
set=${1:-test}
req=$root/requirements/$set.txt
venv=$root/.venv
[ -f "$req" ] || { echo "scripts/venv.sh: no requirements file '$req' (sets: test, bench)" >&2; exit 2; }

if [ ! -x "$venv/bin/python" ]; then
  base=${TESSEL_BASE_PYTHON:-python3}
  "$base" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
    echo "scripts/venv.sh: $($base --version 2>&1) is too old: the JAX stack needs Python 3.10 or newer" >&2; exit 1; }
  echo "creating $venv with $($base --version 2>&1)"
  "$base" -m venv "$venv"
fi

# The stamp holds the digest of every requirements file this set reads (-r includes).
digest=$(cd "$root/requirements" && cat "$set.txt" $(sed -n 's/^-r  *//p' "$set.txt") | sha256sum | cut -d' ' -f1)
stamp=$venv/.installed-$set
if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ]; then
  echo "installing requirements/$set.txt into $venv"
  log=$venv/pip-install.log
  if ! "$venv/bin/python" -m pip install --disable-pip-version-check -r "$req" > "$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" | tail -n 30 >&2
    echo "scripts/venv.sh: pip failed; the whole log is $log" >&2
    exit 1
  fi
  echo "$digest" > "$stamp"
fi
