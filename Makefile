# Warren: `make run` starts the broker, `make test` runs every test. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 5672
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck check bench conformance clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/warren-server --port $(PORT)

test: $(STAMP)
	$(BIN)/ruff check broker protocol config tests
	$(BIN)/mypy
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check broker protocol config tests

typecheck: $(STAMP)
	$(BIN)/mypy

# Warren's own load test; see README "Performance" for amqp-perf against RabbitMQ.
bench: $(STAMP)
	$(BIN)/python tests/benchmarks/run_bench.py

# The shared black-box suite against a Warren started here on port 5679.
conformance: $(STAMP)
	$(BIN)/python tests/benchmarks/with_broker.py --port 5679 -- \
		env AMQP_URL=amqp://guest:guest@127.0.0.1:5679/ WARREN=1 ../shared/conformance/run.sh

clean:
	rm -rf $(VENV) build *.egg-info
