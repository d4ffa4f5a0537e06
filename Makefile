# Warren: `make run` starts the broker, `make test` runs every test. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 5672
STAMP := $(VENV)/.installed-test
RUN_STAMP := $(VENV)/.installed
# the compiled build (setup.py's COMPILED modules), rebuilt when one of them changes
COMPILED := build/compiled
COMPILED_STAMP := $(COMPILED)/.built
COMPILED_SOURCES := $(shell sed -n 's|^    "warren/\(.*\.py\)",$$|\1|p' setup.py)

.PHONY: run test rabbitmq test-pure compile lint typecheck check bench bench-compare conformance crash-test fuzz fuzz-short soak clean \
	console-screenshots wheel test-install

# `make run` needs the broker and mypyc (the compiled build); `make test` also the test tools
# and the PySpark job. The editable install itself is pure: the compiled modules live in
# build/compiled (below), which comes first on the path.
MYPY := mypy==2.4.1
$(RUN_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	WARREN_NO_EXTENSIONS=1 $(BIN)/pip install -q --disable-pip-version-check -e . '$(MYPY)'
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

# tests/test_shovels.py moves messages to and from a real RabbitMQ: Debian's (3.10), started
# here unless one already runs (on 5672; set WARREN_RABBITMQ_URL for another).
RABBITMQ_SERVER := /usr/sbin/rabbitmq-server
$(RABBITMQ_SERVER):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends rabbitmq-server
# (await_startup fails at once while the new node is not registered yet: ping until it is)
rabbitmq: $(RABBITMQ_SERVER)
	@$(SUDO) rabbitmq-diagnostics -q ping >/dev/null 2>&1 || { \
		$(SUDO) rabbitmq-server -detached; \
		for i in $$(seq 120); do \
			$(SUDO) rabbitmq-diagnostics -q ping >/dev/null 2>&1 && break; sleep 1; \
		done; \
		$(SUDO) rabbitmqctl -q await_startup -t 120; }

# RabbitMQ's own rabbitmqadmin, as the image ships it (docker/fetch-rabbitmqadmin).
RABBITMQADMIN := build/rabbitmqadmin
$(RABBITMQADMIN):
	mkdir -p build
	$(SUDO) apt-get update -qq
	docker/fetch-rabbitmqadmin $@

# The compiled build, made once and again only when a compiled module's source changes.
# Without a C compiler setup.py builds it pure, and the broker's first log line says so.
run: $(COMPILED_STAMP)
	@$(LINK_SOURCES)
	PYTHONPATH=$(COMPILED) $(BIN)/warren-server --port $(PORT)

# The compiled build is made while the message-path tests run on pure Python (one core each),
# then the whole suite runs on the compiled build, which is what users run.
test: $(STAMP) $(CHROMIUM) $(GO_AMQP) $(GCC) $(RABBITMQADMIN) rabbitmq
	$(BIN)/ruff check broker protocol config tests pipeline warren
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(MAKE) -s fuzz-short
	mkdir -p build
	$(MAKE) -s compile >build/compile.log 2>&1 & compiling=$$!; \
	$(PURE_PYTEST); tests=$$?; \
	wait $$compiling; built=$$?; \
	if [ $$built != 0 ]; then cat build/compile.log; echo "make compile failed"; fi; \
	[ $$tests = 0 ] && [ $$built = 0 ]
	$(COMPILED_PYTEST)

# The compiled build (setup.py, docs/building.md): the message path's modules compiled with
# mypyc into build/compiled, next to their .py files. Needs a C compiler.
GCC := /usr/bin/gcc
$(GCC):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends gcc libc6-dev python3-dev
# The build's copies of the .py files become links to the sources (and new sources get
# links): a change to a module that is not compiled needs no new build.
LINK_SOURCES = cp -s --remove-destination "$(CURDIR)"/warren/*.py $(COMPILED)/warren/ && \
	for d in broker protocol config pipeline; do \
	cp -rs --remove-destination "$(CURDIR)/$$d/." $(COMPILED)/warren/$$d/; done
$(COMPILED_STAMP): setup.py $(COMPILED_SOURCES) | $(RUN_STAMP)
	rm -rf $(COMPILED)
	$(BIN)/python setup.py -q build --build-lib $(COMPILED)
	touch $@
compile: $(STAMP) $(GCC)
	rm -rf $(COMPILED)
	$(BIN)/python setup.py -q build --build-lib $(COMPILED)
	$(LINK_SOURCES)
	touch $(COMPILED_STAMP)

# A platform wheel and an sdist in dist/ (compiled when a C compiler is there)
wheel: $(RUN_STAMP)
	rm -rf dist
	$(BIN)/pip wheel -q --disable-pip-version-check --no-deps -w dist .
	$(BIN)/pip install -q --disable-pip-version-check build
	$(BIN)/python -m build -q --sdist --outdir dist .

# Installs the checkout and a wheel into fresh venvs, as a user would (minutes: each
# compiles). Not in `make test`; docs/building.md has its figures.
test-install: $(STAMP) $(GCC)
	$(BIN)/pytest -q tests/install_check.py

# The message path's tests, also run on pure Python (the fallback where no compiler is).
MESSAGE_PATH_TESTS := tests/test_compiled.py tests/test_protocol.py tests/test_frames.py \
	tests/test_fuzz_protocol.py tests/test_fuzz_broker.py tests/test_handshake.py \
	tests/test_basic.py tests/test_exchanges.py tests/test_plugin_exchanges.py \
	tests/test_confirms.py tests/test_confirms_tx.py tests/test_hostile_input.py \
	tests/test_queues.py tests/test_dead_letter.py tests/test_alarms_and_limits.py \
	tests/test_protocol_state.py tests/test_engine_in_memory.py tests/test_streams.py \
	tests/test_paged_backlog.py tests/test_dispatch.py tests/test_durability.py \
	tests/test_store_failure.py tests/test_tracing.py tests/test_long_purge.py \
	tests/test_unacked.py
# build/compiled comes before the repository on the path: its warren is the one imported.
# test_routing_scale.py counts the interpreted lines routing runs (and binds stand-in
# destinations the compiled exchange refuses): it runs on pure Python only.
PURE_ONLY := tests/test_routing_scale.py
# Two workers (pytest-xdist): most tests wait on sockets, subprocesses and Spark, so the
# suite takes about half the wall time on CI's 2 cores; worksteal evens out the long files.
COMPILED_PYTEST = PYTHONPATH=$(COMPILED):. WARREN_EXPECT_COMPILED=1 \
	$(BIN)/pytest -q -n 2 --dist worksteal --durations=15 -o pythonpath= \
	$(addprefix --ignore=,$(PURE_ONLY))
# (two kill -9 rounds of test_durability.py, not ten: the compiled run has the others)
PURE_PYTEST = WARREN_CRASH_ROUNDS=2 $(BIN)/pytest -q $(MESSAGE_PATH_TESTS) $(PURE_ONLY)
test-pure: $(STAMP)
	$(PURE_PYTEST)

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

# The same, FUZZ_SHORT_SECONDS per target (about 15 s in all with start-up): meant to run
# in `make test` and CI, so that a target that stops on its own seeds fails the build
FUZZ_SHORT_SECONDS ?= 5
fuzz-short: $(STAMP)
	$(BIN)/pip install -q --disable-pip-version-check atheris
	$(BIN)/python tests/fuzz_atheris.py protocol -max_total_time=$(FUZZ_SHORT_SECONDS)
	$(BIN)/python tests/fuzz_atheris.py broker -max_total_time=$(FUZZ_SHORT_SECONDS)

# 1,000 connections, 5,000 channels, 10,000 queues publishing and consuming for
# SOAK_MINUTES; fails on an error, a lost confirmed message or broker memory growth
SOAK_MINUTES ?= 10
soak: $(STAMP)
	$(BIN)/python tests/benchmarks/soak.py --minutes $(SOAK_MINUTES)

# the console screenshots in docs/operating.md, taken by the console's end-to-end tests
console-screenshots: $(STAMP) $(CHROMIUM)
	WARREN_CONSOLE_SHOTS=docs $(BIN)/pytest -q tests/test_console.py

clean:
	rm -rf $(VENV) build dist *.egg-info
