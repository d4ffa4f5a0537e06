# Warren: `make run` starts the broker, `make test` runs every test. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 5672
STAMP := $(VENV)/.installed-test
RUN_STAMP := $(VENV)/.installed

.PHONY: run test test-compiled compile lint typecheck check bench bench-compare conformance crash-test fuzz soak clean \
	console-screenshots

# `make run` needs only the broker; `make test` also the test tools and the PySpark job.
$(RUN_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e .
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml $(RUN_STAMP)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test,pipeline]'
	touch $(STAMP)

# The web console's tests drive Debian's chromium through Playwright (no browser download).
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
$(CHROMIUM):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends chromium

# tests/test_go_channel_flow.py builds a program with RabbitMQ's Go client, Debian's package.
GO_AMQP := /usr/share/gocode/src/github.com/rabbitmq/amqp091-go
$(GO_AMQP):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends golang-go golang-github-rabbitmq-amqp091-go-dev

run: $(RUN_STAMP)
	$(BIN)/warren-server --port $(PORT)

# The compiled build is made while the pure-Python suite runs: each takes one core.
test: $(STAMP) $(CHROMIUM) $(GO_AMQP) $(GCC)
	$(BIN)/ruff check broker protocol config tests pipeline warren
	$(BIN)/lint-imports
	$(BIN)/mypy
	mkdir -p build
	$(MAKE) -s compile >build/compile.log 2>&1 & compiling=$$!; \
	$(BIN)/pytest -q; tests=$$?; \
	wait $$compiling; built=$$?; \
	if [ $$built != 0 ]; then cat build/compile.log; echo "make compile failed"; fi; \
	[ $$tests = 0 ] && [ $$built = 0 ]
	$(COMPILED_PYTEST)

# The optional compiled build (setup.py, docs/performance.md): the message path's modules
# compiled with mypyc into build/compiled, next to their .py files. Needs a C compiler.
COMPILED := build/compiled
GCC := /usr/bin/gcc
$(GCC):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends gcc libc6-dev
compile: $(STAMP) $(GCC)
	rm -rf $(COMPILED)
	WARREN_COMPILE=1 $(BIN)/python setup.py -q build --build-lib $(COMPILED)

# The same tests on the compiled build: the tests of the compiled modules and the message
# path (the rest of the suite, management and tools, runs interpreted code either way).
COMPILED_TESTS := tests/test_compiled.py tests/test_protocol.py tests/test_frames.py \
	tests/test_fuzz_protocol.py tests/test_fuzz_broker.py tests/test_handshake.py \
	tests/test_basic.py tests/test_exchanges.py tests/test_plugin_exchanges.py \
	tests/test_confirms.py tests/test_confirms_tx.py tests/test_hostile_input.py \
	tests/test_queues.py tests/test_dead_letter.py tests/test_alarms_and_limits.py \
	tests/test_protocol_state.py tests/test_engine_in_memory.py tests/test_streams.py \
	tests/test_paged_backlog.py tests/test_dispatch.py tests/test_durability.py \
	tests/test_store_failure.py tests/test_tracing.py tests/test_long_purge.py
# build/compiled comes before the repository on the path: its warren is the one imported
# (two kill -9 rounds of test_durability.py, not ten: the pure run has the others)
COMPILED_PYTEST = PYTHONPATH=$(COMPILED):. WARREN_EXPECT_COMPILED=1 WARREN_CRASH_ROUNDS=2 \
	$(BIN)/pytest -q -o pythonpath= $(COMPILED_TESTS)
test-compiled: compile
	$(COMPILED_PYTEST)

lint: $(STAMP)
	$(BIN)/ruff check broker protocol config tests pipeline warren
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# Warren's own load test; see docs/performance.md for amqp-perf against RabbitMQ.
bench: $(STAMP)
	$(BIN)/python tests/benchmarks/run_bench.py

# The shared black-box suite against a Warren started here on port 5679 (API on 15679).
# It was written against RabbitMQ 3.10: Warren runs it with 3.x's behaviour (tests/rabbitmq-3.x.conf).
conformance: $(STAMP)
	$(BIN)/python tests/benchmarks/with_broker.py --port 5679 --management-port 15679 \
		--config tests/rabbitmq-3.x.conf -- \
		env AMQP_URL=amqp://guest:guest@127.0.0.1:5679/ MGMT_URL=http://guest:guest@127.0.0.1:15679 \
		WARREN=1 ../shared/conformance/run.sh

# kill -9 a broker 100 times while a publisher with confirms runs; nothing confirmed may be lost
crash-test: $(STAMP)
	WARREN_CRASH_ROUNDS=100 $(BIN)/pytest -q tests/test_durability.py -k kill_9

# amqp-perf against Warren and a second broker, side by side, S1-S10 (see docs/performance.md),
# then the routing curve, 100 to 100,000 topic bindings (docs/performance-routing.md)
bench-compare: $(STAMP)
	PYTHON=$(BIN)/python tests/benchmarks/compare.sh

# Coverage-guided fuzzing with atheris (installed here only), FUZZ_SECONDS per target:
# protocol/ on its own, then a broker connection in memory. Not in CI; crashes go to
# build/fuzz-crashes/. A longer run of the hypothesis suites instead:
#   WARREN_FUZZ_EXAMPLES=20000 .venv/bin/pytest tests/test_fuzz_protocol.py tests/test_fuzz_broker.py
FUZZ_SECONDS ?= 600
fuzz: $(STAMP)
	$(BIN)/pip install -q --disable-pip-version-check atheris
	$(BIN)/python tests/fuzz_atheris.py protocol -max_total_time=$(FUZZ_SECONDS)
	$(BIN)/python tests/fuzz_atheris.py broker -max_total_time=$(FUZZ_SECONDS)

# 1,000 connections, 5,000 channels, 10,000 queues publishing and consuming for
# SOAK_MINUTES; fails on an error, a lost confirmed message or broker memory growth
SOAK_MINUTES ?= 10
soak: $(STAMP)
	$(BIN)/python tests/benchmarks/soak.py --minutes $(SOAK_MINUTES)

# the console screenshots in docs/operating.md, taken by the console's end-to-end tests
console-screenshots: $(STAMP) $(CHROMIUM)
	WARREN_CONSOLE_SHOTS=docs $(BIN)/pytest -q tests/test_console.py

clean:
	rm -rf $(VENV) build *.egg-info
