"""Celery's remote control (pidbox) against Warren's RabbitMQ 4.3 defaults.

Celery before 5.5 declared its control queues (``<host>.celery.pidbox`` for a worker,
``<oid>.reply.celery.pidbox`` for a client) transient and not exclusive; RabbitMQ 4.x refuses
them (transient_nonexcl_queues), so such a worker crash-loops in production. Celery 5.5+
declares them exclusive (``control_queue_exclusive = True``); setting it to False gives the
old declarations. Global qos is not exercised here: kombu asks for it only from a server
whose product is RabbitMQ 3.3-3.x (``qos_semantics_matches_spec``), never from Warren.
"""

from __future__ import annotations

from collections.abc import Iterator

import amqp
import pytest
from celery import Celery

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
