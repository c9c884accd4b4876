# The two commands of the README. Both set up .venv on first use; only `make test`
# installs test-only tools (dev extras, Chromium for the live-page test).
.PHONY: run test test-fast lint

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
