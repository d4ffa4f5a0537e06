"""A traced broker under a small shop's workload, for warren-report's example report.

    python tests/benchmarks/trace_demo.py --seconds 120 --trace /tmp/demo-trace
    warren-report --trace /tmp/demo-trace --out /tmp/demo-report --bucket-seconds 10

Real clients (pika, one connection per thread) against a Warren started in-process with
tracing on: orders fan out to an audit queue and are shared by two quick consumers and a
slow one; emails have a 2 s TTL and a consumer that nacks now and then and cannot keep up
during bursts; payments is a quorum queue with a 1 s consumer timeout, delayed retries
and a delivery limit, served by a consumer that sometimes hangs. Everything that dies goes
to dead-letters.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from typing import Any

import pika

from warren.broker.testkit import RunningBroker, run_broker

DLX = {"x-dead-letter-exchange": "dlx"}


def setup(broker: RunningBroker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.exchange_declare("shop", "topic")
    ch.exchange_declare("dlx", "fanout")
    ch.queue_declare("dead-letters", durable=True)
    ch.queue_bind("dead-letters", "dlx")
    ch.queue_declare("orders", durable=True)
    ch.queue_declare("audit", durable=True)
    ch.queue_declare("emails", arguments={**DLX, "x-message-ttl": 2000})
    ch.queue_declare("payments", durable=True, arguments={
        **DLX, "x-queue-type": "quorum", "x-consumer-timeout": 1000,
        "x-delayed-retry-type": "failed", "x-delayed-retry-min": 200, "x-delivery-limit": 3,
    })  # fmt: skip
    ch.queue_bind("orders", "shop", "order.*")
    ch.queue_bind("audit", "shop", "order.*")
    ch.queue_bind("emails", "shop", "email.*")
    ch.queue_bind("payments", "shop", "payment.*")
    conn.close()


def publisher(broker: RunningBroker, stop: threading.Event, rate: float) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.confirm_delivery()
    rnd = random.Random(1)
    n = 0
    started = time.monotonic()
    while not stop.is_set():
        elapsed = time.monotonic() - started
        burst = int(elapsed) % 30 < 3  # three seconds of every thirty: four times the rate
        for _ in range(4 if burst else 1):
            n += 1
            kind = rnd.choices(["order", "email", "payment", "lost"], [50, 30, 19, 1])[0]
            props = pika.BasicProperties(message_id=f"{kind}-{n}", delivery_mode=2)
            ch.basic_publish("shop", f"{kind}.new", f"{kind} {n}".encode(), props)
        next_at = started + n / rate
        time.sleep(max(0.0, next_at - time.monotonic()))
    conn.close()


def consumer(
    broker: RunningBroker,
    stop: threading.Event,
    queue: str,
    tag: str,
    work: Any,
    prefetch: int = 10,
) -> None:
    """Consume until stopped; ``work(body) -> "ack" | "nack"`` after its delay.

    A consumer the broker cancels (consumer timeout) subscribes again under a new tag; if
    the client library gives up on the connection, a new one is opened, as services do.
    """
    subscriptions = 0
    while not stop.is_set():
        try:
            conn = pika.BlockingConnection(pika.URLParameters(broker.url))
            ch = conn.channel()
            ch.basic_qos(prefetch_count=prefetch)
            active = [False]

            def on_message(c: Any, method: Any, props: Any, body: bytes) -> None:
                if work(body) == "ack":
                    c.basic_ack(method.delivery_tag)
                else:
                    c.basic_nack(method.delivery_tag, requeue=True)

            ch.add_on_cancel_callback(lambda frame, flag=active: flag.__setitem__(0, False))
            while not stop.is_set():
                if not active[0]:
                    subscriptions += 1
                    name = tag if subscriptions == 1 else f"{tag}-{subscriptions}"
                    ch.basic_consume(queue, on_message, consumer_tag=name)
                    active[0] = True
                conn.process_data_events(0.2)
            conn.close()
        except (pika.exceptions.AMQPError, KeyError):
            time.sleep(0.2)


def worker(seconds: float, nack: float = 0.0, hang: float = 0.0, seed: int = 0) -> Any:
    """Work about ``seconds`` per message; nack a share; hang (1.3 s, past the timeout) a share."""
    rnd = random.Random(seed)

    def work(body: bytes) -> str:
        roll = rnd.random()
        if roll < hang:
            time.sleep(1.3)
            return "ack"  # too late: the broker took it back; RabbitMQ ignores this ack
        time.sleep(rnd.lognormvariate(0, 0.4) * seconds)
        return "nack" if roll < hang + nack else "ack"

    return work


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--rate", type=float, default=120.0, help="messages per second")
    parser.add_argument("--trace", required=True, help="trace directory")
    args = parser.parse_args()
    with run_broker(trace_enabled=True, trace_dir=args.trace) as broker:
        setup(broker)
        stop = threading.Event()
        consumers = [
            ("orders", "orders-fast-1", worker(0.004, seed=1)),
            ("orders", "orders-fast-2", worker(0.004, seed=2)),
            ("orders", "orders-slow", worker(0.060, seed=3)),
            ("audit", "audit", worker(0.001, seed=4)),
            ("emails", "mailer", worker(0.025, nack=0.05, seed=5)),
            ("payments", "payment-gateway", worker(0.020, nack=0.08, hang=0.01, seed=6)),
            ("dead-letters", "dlq-inspector", worker(0.002, seed=7)),
        ]
        threads = [
            threading.Thread(
                target=consumer,
                args=(broker, stop, q, tag, work, 1 if q == "payments" else 10),
                daemon=True,
            )
            for q, tag, work in consumers
        ]
        threads.append(
            threading.Thread(target=publisher, args=(broker, stop, args.rate), daemon=True)
        )
        for thread in threads:
            thread.start()
        time.sleep(args.seconds)
        stop.set()
        for thread in threads:
            thread.join(10)
        broker.call(broker.server.broker.tracing.flush)
        status = broker.call(broker.server.broker.tracing.status)
    print(f"trace in {args.trace}: {status['events_dropped']:,} events dropped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
