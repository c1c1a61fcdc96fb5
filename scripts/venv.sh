#!/usr/bin/env bash
# The project's Python environments (ignored by git), each installed from its requirements file,
# pinned. A second run reuses them: pip runs again only when the requirements changed since the
# last install.
#   test:    .venv, the first python3 on PATH (3.10 or newer): the test suite's JAX stack
#   bench:   .venv, test + PyTorch 2.13 CPU for the peers
#   maxtext: .venv-maxtext, Python 3.12 (MaxText 0.2.5 needs it): MaxText on the CPU, the peer of
#            the MaxText tests; installed with --no-deps (every dependency is pinned in the file)
# Usage: scripts/venv.sh [test|bench|maxtext]
# Afterwards .venv/bin/python (or .venv-maxtext/bin/python) is the interpreter the tests use.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
set=${1:-test}
req=$root/requirements/$set.txt
[ -f "$req" ] || { echo "scripts/venv.sh: no requirements file '$req' (sets: test, bench, maxtext)" >&2; exit 2; }

# Python 3.12 for MaxText: $TESSEL_MAXTEXT_PYTHON, python3.12 on PATH, or pyenv's 3.12.
python312() {
  if [ -n "${TESSEL_MAXTEXT_PYTHON:-}" ]; then echo "$TESSEL_MAXTEXT_PYTHON"; return; fi
  if python3.12 -c '' 2>/dev/null; then command -v python3.12; return; fi
  local p
  for p in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
    if [ -x "$p" ]; then echo "$p"; return; fi
  done
  echo "scripts/venv.sh: MaxText needs Python 3.12: none found (set TESSEL_MAXTEXT_PYTHON)" >&2
  return 1
}

pip_args=()
if [ "$set" = maxtext ]; then
  venv=$root/.venv-maxtext
  base=$(python312)
  pip_args=(--no-deps)
else
  venv=$root/.venv
  base=${TESSEL_BASE_PYTHON:-python3}
  "$base" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
    echo "scripts/venv.sh: $($base --version 2>&1) is too old: the JAX stack needs Python 3.10 or newer" >&2; exit 1; }
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "creating $venv with $($base --version 2>&1)"
  "$base" -m venv "$venv"
fi

# The stamp holds the digest of every requirements file this set reads (-r includes).
digest=$(cd "$root/requirements" && cat "$set.txt" $(sed -n 's/^-r  *//p' "$set.txt") | sha256sum | cut -d' ' -f1)
stamp=$venv/.installed-$set
if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ]; then
  echo "installing requirements/$set.txt into $venv"
  log=$venv/pip-install.log
  # pip compiles the bytecode here: where PYTHONDONTWRITEBYTECODE is set (CI's machines), Python
  # never writes it on import, and each test process would compile what it imports again.
  if ! "$venv/bin/python" -m pip install --disable-pip-version-check "${pip_args[@]}" -r "$req" > "$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" | tail -n 30 >&2
    echo "scripts/venv.sh: pip failed; the whole log is $log" >&2
    exit 1
  fi
  echo "$digest" > "$stamp"
fi
