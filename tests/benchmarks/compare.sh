#!/usr/bin/env bash
# Compare Warren with RabbitMQ using amqp-perf (the C load generator, built outside this repo).
#
#   WARREN_PID=$(pgrep -f warren-server | head -1) RABBIT_PID=$(pgrep -f beam.smp | head -1) \
#       tests/benchmarks/compare.sh
#
# Environment (all optional):
#   WARREN_URL   amqp://guest:guest@127.0.0.1:5673/
#   RABBIT_URL   amqp://guest:guest@127.0.0.1:5672/
#   AMQP_PERF    /tmp/perf/amqp-perf
#   WARREN_PID, RABBIT_PID   broker pids, passed as --broker-pid (CPU figures in the raw JSON)
#   RUNS=3  RUN_TIME=10      runs per scenario and broker, seconds per run
#   OUT_DIR                  where the raw JSON goes (default: a new mktemp -d directory)
#   EXTRA=1                  also S6 (RUNS times), S9 and S10 (once each) via compare_extra.py
#   PYTHON                   .venv/bin/python (compare_extra.py needs pika for S9's cleanup)
#   RABBIT_S10_URL, RABBIT_S10_PID   a RabbitMQ for S10 (default RABBIT_URL/RABBIT_PID): it
#                            needs a file limit above 10,000; Debian's service gets 1,024
#   S10_CONNECTIONS=10000    S9_MESSAGES=1000000
#   ROUTING=1                also the routing curve (routing_curve.py): a topic exchange with
#                            ROUTING_BINDINGS=100,1000,10000,100000 bindings, ROUTING_RUNS=2
#                            runs of ROUTING_TIME=3 s per broker and point
#
# Each scenario runs RUNS times per broker, alternating brokers run by run (who goes first
# also alternates), so drift and noise hit both. S7's queue is deleted after each S7 run, so
# that its backlog does not weigh on the scenarios after it. The table shows medians and the ratio
# Warren/RabbitMQ of the consume rate (S1-S5) or publish rate (S7).
set -euo pipefail

WARREN_URL=${WARREN_URL:-amqp://guest:guest@127.0.0.1:5673/}
RABBIT_URL=${RABBIT_URL:-amqp://guest:guest@127.0.0.1:5672/}
AMQP_PERF=${AMQP_PERF:-/tmp/perf/amqp-perf}
WARREN_PID=${WARREN_PID:-}
RABBIT_PID=${RABBIT_PID:-}
RUNS=${RUNS:-3}
RUN_TIME=${RUN_TIME:-10}
EXTRA=${EXTRA:-1}
PYTHON=${PYTHON:-.venv/bin/python}
RABBIT_S10_URL=${RABBIT_S10_URL:-$RABBIT_URL}
RABBIT_S10_PID=${RABBIT_S10_PID:-$RABBIT_PID}
S10_CONNECTIONS=${S10_CONNECTIONS:-10000}
S9_MESSAGES=${S9_MESSAGES:-1000000}
OUT_DIR=${OUT_DIR:-$(mktemp -d /tmp/warren-compare.XXXXXX)}
ROUTING=${ROUTING:-1}
ROUTING_BINDINGS=${ROUTING_BINDINGS:-100,1000,10000,100000}
ROUTING_RUNS=${ROUTING_RUNS:-2}
ROUTING_TIME=${ROUTING_TIME:-3}

if [[ ! -x $AMQP_PERF ]]; then
    cat >&2 <<EOF
amqp-perf not found at $AMQP_PERF. Build it outside this repository:
    apt-get install -y librabbitmq-dev
    cp -r /work/shared/perf /tmp/perf && make -C /tmp/perf
or point AMQP_PERF at an existing binary.
EOF
    exit 2
fi
mkdir -p "$OUT_DIR"

# name | amqp-perf flags | JSON field compared
SCENARIOS=(
    "S1|--autoack|consume_rate"
    "S2|--prefetch 100|consume_rate"
    "S2-multiack10|--prefetch 100 --multi-ack 10|consume_rate"
    "S3|--prefetch 100 --confirm 100|consume_rate"
    "S4|--durable --persistent --prefetch 100 --confirm 100|consume_rate"
    "S5|--autoack --size 1024|consume_rate"
    "S7|--consumers 0|publish_rate"
    "S8|--rate 1000 --prefetch 100|latency_us.p99"
)

run_one() { # broker scenario run flags...
    local broker=$1 name=$2 run=$3 url pid out rc=0
    shift 3
    if [[ $broker == warren ]]; then url=$WARREN_URL pid=$WARREN_PID; else url=$RABBIT_URL pid=$RABBIT_PID; fi
    out="$OUT_DIR/$broker-$name-run$run.json"
    local cmd=("$AMQP_PERF" --uri "$url" --time "$RUN_TIME" --queue "cmp-$name" --purge --json --quiet "$@")
    if [[ -n $pid ]]; then cmd+=(--broker-pid "$pid"); fi
    echo "[$(date +%T)] $broker $name run $run: ${cmd[*]}" >&2
    "${cmd[@]}" >"$out" 2>"${out%.json}.err" || rc=$?
    if [[ $rc -ne 0 ]]; then
        echo "  exit $rc: $(tail -n 3 "${out%.json}.err" | tr '\n' ' ')" >&2
    fi
    if [[ $name == S7 ]]; then
        # S7 leaves a million messages queued: gone before the next scenario, on both brokers
        "$PYTHON" -c "import sys; sys.path.insert(0, sys.argv[1]); from compare_extra import \
delete_queue; delete_queue(sys.argv[2], sys.argv[3])" "$(dirname "$0")" "$url" "cmp-$name"
        sleep 2
    fi
    sleep 1
}

for run in $(seq 1 "$RUNS"); do
    for entry in "${SCENARIOS[@]}"; do
        IFS='|' read -r name flags _ <<<"$entry"
        read -ra fl <<<"$flags"
        if ((run % 2)); then order=(warren rabbit); else order=(rabbit warren); fi
        for broker in "${order[@]}"; do run_one "$broker" "$name" "$run" "${fl[@]}"; done
    done
done

# S6, S9, S10 need a broker pid (RSS, CPU from /proc); their rows join the table below
EXTRA_ROWS=()
extra_one() { # broker name run compare_extra.py-args...
    local broker=$1 name=$2 run=$3 url pid out
    shift 3
    if [[ $broker == warren ]]; then url=$WARREN_URL pid=$WARREN_PID; else url=$RABBIT_URL pid=$RABBIT_PID; fi
    if [[ $name == S10 && $broker == rabbit ]]; then url=$RABBIT_S10_URL pid=$RABBIT_S10_PID; fi
    out="$OUT_DIR/$broker-$name-run$run.json"
    echo "[$(date +%T)] $broker $name run $run: compare_extra.py $* --url $url --pid $pid" >&2
    AMQP_PERF=$AMQP_PERF "$PYTHON" "$(dirname "$0")/compare_extra.py" "$@" --url "$url" --pid "$pid" \
        >"$out" || echo "  failed: $(cat "$out")" >&2
    sleep 1
}
if [[ $EXTRA == 1 ]]; then
    if [[ -z $WARREN_PID || -z $RABBIT_PID ]]; then
        echo "S6, S9, S10 need WARREN_PID and RABBIT_PID; set EXTRA=0 to skip them" >&2
        exit 2
    fi
    ulimit -n "$((S10_CONNECTIONS + 1000))" 2>/dev/null || true
    for run in $(seq 1 "$RUNS"); do
        if ((run % 2)); then order=(warren rabbit); else order=(rabbit warren); fi
        for broker in "${order[@]}"; do extra_one "$broker" S6 "$run" s6 --time "$RUN_TIME"; done
    done
    leftovers=(cmp-S6-0 cmp-S6-1 cmp-S6-2 cmp-S6-3)
    for entry in "${SCENARIOS[@]}"; do leftovers+=("cmp-${entry%%|*}"); done
    for broker in warren rabbit; do
        extra_one "$broker" cleanup 1 cleanup --names "${leftovers[@]}"
        extra_one "$broker" S9-transient 1 s9 --messages "$S9_MESSAGES"
        extra_one "$broker" S9-durable 1 s9 --messages "$S9_MESSAGES" --persistent
        extra_one "$broker" S10 1 s10 --connections "$S10_CONNECTIONS" --idle 30
    done
    EXTRA_ROWS=(
        "S6|4 queues, 1p/1c each, --prefetch 100|consume_rate"
        "S9-transient|$S9_MESSAGES x 16 B queued, broker VmRSS KiB|rss_kib"
        "S9-transient|the same, growth of VmRSS during the fill, KiB|rss_delta_kib"
        "S9-durable|$S9_MESSAGES x 16 B persistent, durable queue, VmRSS KiB|rss_kib"
        "S10|$S10_CONNECTIONS idle connections + channels, VmRSS KiB|rss_kib"
        "S10|the same, bytes of VmRSS per connection|bytes_per_connection"
        "S10|$S10_CONNECTIONS idle connections, broker CPU % over 30 s|idle_cpu_pct"
    )
fi

echo "raw JSON: $OUT_DIR" >&2
printf '%s\n' "${SCENARIOS[@]}" "${EXTRA_ROWS[@]}" | python3 -c '
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])

def median(broker, name, field):
    vals, bad = [], 0
    for f in sorted(out.glob(f"{broker}-{name}-run*.json")):
        try:
            doc = json.loads(f.read_text())
        except ValueError:
            bad += 1
            continue
        value = doc
        for part in field.split("."):  # latency_us.p99 and the like
            value = value.get(part) if isinstance(value, dict) else None
        if not doc.get("ok") or value is None:
            bad += 1
        if value is not None:
            vals.append(float(value))
    return (statistics.median(vals) if vals else None), bad

def cell(v, bad):
    s = "n/a" if v is None else f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"
    return s + (f" ({bad} failed)" if bad else "")

print("| scenario | metric | Warren median | RabbitMQ median | ratio W/R |")
print("|---|---|---:|---:|---:|")
rows = []
for line in sys.stdin.read().split("\n"):
    if not line:
        continue
    name, flags, field = line.split("|")
    rows.append((name, flags, field))
    if field == "publish_rate":  # also show how fast the broker actually read the publishes
        rows.append((name, flags, "broker_ingress_rate"))
for name, flags, field in rows:
    w, wbad = median("warren", name, field)
    r, rbad = median("rabbit", name, field)
    ratio = f"{w / r:.2f}" if w is not None and r else "n/a"
    print(f"| {name} `{flags}` | {field} | {cell(w, wbad)} | {cell(r, rbad)} | {ratio} |")
' "$OUT_DIR"

# routing cost against the number of bindings (issue 24): its own table, after the one above
if [[ $ROUTING == 1 ]]; then
    echo "[$(date +%T)] routing curve: routing_curve.py --bindings $ROUTING_BINDINGS" >&2
    echo
    "$PYTHON" "$(dirname "$0")/routing_curve.py" --warren-url "$WARREN_URL" --rabbit-url "$RABBIT_URL" \
        --bindings "$ROUTING_BINDINGS" --runs "$ROUTING_RUNS" --time "$ROUTING_TIME" \
        --json "$OUT_DIR/routing-curve.json" || echo "routing curve failed" >&2
fi
