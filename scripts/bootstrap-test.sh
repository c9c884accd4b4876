#!/usr/bin/env bash
# What `make test` needs beyond `make run`: the dev and ray extras (pytest, schemathesis,
# the multi-node backend and its CI failure test), headless Chromium + its WebDriver
# (Debian packages) for the live-page browser test, and redis-server for the Batch API's
# Redis Streams queue tests.
set -euo pipefail
cd "$(dirname "$0")/.."

ANDANTE_EXTRAS="${ANDANTE_EXTRAS:-all,dev,ray}" ./scripts/bootstrap.sh

# CI runs as root on a fresh machine; elsewhere a missing browser only skips that test.
if ! [ -x /usr/bin/chromium ] || ! [ -x /usr/bin/chromedriver ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "bootstrap-test: installing chromium and chromium-driver (apt)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "bootstrap-test: chromium/chromium-driver missing; the browser test will be skipped" >&2
  fi
fi

if ! command -v redis-server >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "bootstrap-test: installing redis-server (apt)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "bootstrap-test: redis-server missing; the Redis queue tests will be skipped" >&2
  fi
fi

# The real vLLM CPU build: the peer of the benchmarks and the engine andante.vllm plugs
# into (its tests serve it). Installed once into $ANDANTE_PEERS (default runs/peers, git
# ignored), in a venv of its own: vLLM never enters andante's .venv.
if [ "${ANDANTE_SKIP_VLLM:-0}" != 1 ]; then
  echo "bootstrap-test: vLLM CPU peer (benchmarks/peers/setup --only vllm --only model)" >&2
  ./benchmarks/peers/setup --only vllm --only model
fi
