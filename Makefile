# The two commands of the README. Both set up .venv on first use.
.PHONY: run test test-fast lint

run:
	./scripts/bootstrap.sh
	.venv/bin/andante serve

test:
	./scripts/bootstrap.sh
	./scripts/test.sh

test-fast:
	.venv/bin/python -m pytest -m "not slow" -x

lint:
	.venv/bin/ruff check andante tests benchmarks
	.venv/bin/mypy andante
