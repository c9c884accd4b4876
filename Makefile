# The two commands of the README. Both set up .venv on first use; only `make test`
# installs test-only tools (dev extras, Chromium for the live-page test).
.PHONY: run test test-fast lint peers

run:
	./scripts/bootstrap.sh
	.venv/bin/andante serve

test:
	./scripts/bootstrap-test.sh
	./scripts/test.sh

test-fast:
	.venv/bin/python -m pytest -m "not slow" -x

lint:
	.venv/bin/ruff check andante tests experiments benchmarks
	.venv/bin/mypy andante

# The benchmark peers (vLLM CPU, llama.cpp, converted models, Vidur and its profiling
# dataset) under $ANDANTE_PEERS
# (default runs/peers); see benchmarks/peers/setup --help.
peers:
	./benchmarks/peers/setup
