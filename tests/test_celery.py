"""Celery's remote control (pidbox) against Warren's RabbitMQ 4.3 defaults.

Celery before 5.5 declared its control queues (``<host>.celery.pidbox`` for a worker,
``<oid>.reply.celery.pidbox`` for a client) transient and not exclusive; RabbitMQ 4.x refuses
them (transient_nonexcl_queues), so such a worker crash-loops in production. Celery 5.5+
declares them exclusive (``control_queue_exclusive = True``); setting it to False gives the
old declarations. A worker asks for global qos only from a server whose product is RabbitMQ
3.3-3.x (kombu's ``qos_semantics_matches_spec``): the last test makes Warren say it is one.
"""

from __future__ import annotations

from collections.abc import Iterator

import amqp
import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from tests.http_api import HttpApi
from warren.broker.testkit import RunningBroker, run_broker

PERMIT = (("transient_nonexcl_queues", True),)


@pytest.fixture(scope="module")
def default() -> Iterator[RunningBroker]:
    with run_broker() as running:
        yield running


@pytest.fixture(scope="module")
def permitted() -> Iterator[RunningBroker]:
    with run_broker(deprecated_features_permit=PERMIT) as running:
        yield running


def celery_app(broker: RunningBroker, exclusive: bool) -> Celery:
    app = Celery("warren-test", broker=broker.url, set_as_current=False)
    app.conf.control_queue_exclusive = exclusive  # False: Celery < 5.5's declarations
    app.conf.broker_connection_max_retries = 0
    return app


def worker_listens(app: Celery, hostname: str) -> None:
    """What a worker's remote-control step declares and consumes: its pidbox queue."""
    with app.connection_for_write() as conn:
        node = app.control.mailbox(conn).Node(hostname)
        node.listen(conn.default_channel)


def test_old_celery_control_queues_are_refused_as_on_4_3(default: RunningBroker) -> None:
    app = celery_app(default, exclusive=False)
    with pytest.raises(amqp.exceptions.InternalError) as caught:
        worker_listens(app, "w1@test")
    assert caught.value.reply_code == 541
    assert "Feature `transient_nonexcl_queues` is deprecated." in caught.value.reply_text
    with pytest.raises(amqp.exceptions.InternalError):
        app.control.ping(timeout=0.1)  # the client's reply queue: the same refusal


def test_old_celery_control_queues_work_with_the_permit_key(permitted: RunningBroker) -> None:
    app = celery_app(permitted, exclusive=False)
    worker_listens(app, "w1@test")
    assert app.control.ping(timeout=0.1) == []  # declared; no worker is there to answer


def test_current_celery_works_with_the_defaults(default: RunningBroker) -> None:
    app = celery_app(default, exclusive=True)
    worker_listens(app, "w1@test")
    assert app.control.ping(timeout=0.1) == []
    with app.connection_for_write() as conn:  # the task queue Celery declares: durable
        app.amqp.queues["celery"](conn.default_channel).declare()
    assert "celery" in default.queues()


def test_a_worker_that_asks_for_global_qos_runs_with_the_defaults() -> None:
    """A Celery worker sends basic.qos(global=true) to a server that says it is RabbitMQ
    3.3-3.x (kombu's qos_semantics_matches_spec; celery.worker.consumer.tasks.Tasks.qos_global).
    RabbitMQ 4.3 denies global_qos by default and applies the same prefetch per consumer
    (rabbit_channel:handle_method/3, basic.qos global=true, is_global_qos_permitted/0 false:
    the method is handled as global=false), so the worker runs its tasks; the management API
    shows the limit its channel got. Permitted, the limit is the channel's
    (test_deprecated_features.py::test_global_qos_is_shared_once_permitted).
    """
    with run_broker(management_port=0, product_name="RabbitMQ", product_version="3.13.7") as broker:
        app = Celery("warren-test", broker=broker.url, backend="rpc://", set_as_current=False)
        app.conf.broker_connection_max_retries = 0

        @app.task(name="add")
        def add(x: int, y: int) -> int:
            return x + y

        with app.connection_for_write() as conn:
            assert conn.qos_semantics_matches_spec is False  # kombu will ask for global qos
        # the embedded worker takes about 10 s to stop, against RabbitMQ 3.10 as well
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
            assert add.delay(2, 3).get(timeout=10) == 5
            port = broker.server.management_port
            assert port
            limits = [
                (c["prefetch_count"], c["global_prefetch_count"])
                for c in HttpApi(port).ok("GET", "/api/channels")
                if c["prefetch_count"] or c["global_prefetch_count"]
            ]
            # (prefetch_count, global_prefetch_count): worker_prefetch_multiplier 4 x concurrency 1
            assert limits == [(4, 0)]
