"""Transactions on a channel: tx.select, tx.commit, tx.rollback.

In tx mode ``channel_publish.basic_publish`` keeps publishes in ``Channel.tx_publishes``
and ``channel_consumers`` keeps settles in ``Channel.tx_settles``; a commit routes and
settles them in order, and answers once the store has the published messages on disk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pamqp import commands

from warren.broker.engine import channel_consumers, channel_publish
from warren.protocol.constants import INTERNAL_ERROR, PRECONDITION_FAILED
from warren.protocol.errors import ChannelError, ConnectionError_

if TYPE_CHECKING:
    from warren.broker.engine.channel import Channel


def tx_select(ch: Channel, method: commands.Tx.Select) -> None:
    if ch.confirm:
        raise ChannelError(PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
    ch.tx = True
    ch.reply(commands.Tx.SelectOk())


def _require_tx(ch: Channel) -> None:
    if not ch.tx:
        raise ChannelError(PRECONDITION_FAILED, "channel is not transactional")


def tx_commit(ch: Channel, method: commands.Tx.Commit) -> None:
    _require_tx(ch)
    publishes, ch.tx_publishes = ch.tx_publishes, []
    settles, ch.tx_settles = ch.tx_settles, []
    store = ch.store
    stored_before = store.published if store is not None else 0
    for exchange, msg, mandatory, ttl in publishes:
        if not exchange.deleted:
            channel_publish.route(ch, exchange, msg, mandatory, ttl, 0)
    for kind, msgs, requeue in settles:
        if kind == "ack":
            channel_consumers.ack(ch, msgs)
        else:
            channel_consumers.reject(ch, msgs, requeue, kind == "reject")
    if store is not None and (store.published != stored_before or store.commits_waiting):
        # like a confirm: once the messages are on disk
        store.after_sync(lambda on_disk: _commit_synced(ch, on_disk))
        return
    ch.reply(commands.Tx.CommitOk())


def _commit_synced(ch: Channel, on_disk: bool) -> None:
    if ch.closed:
        return
    if on_disk:
        ch.reply(commands.Tx.CommitOk())
    else:
        store = ch.store
        error = store.error if store is not None else None
        ch.conn.connection_error(
            ConnectionError_(INTERNAL_ERROR, f"message store failed: {error}", 90, 20)
        )


def tx_rollback(ch: Channel, method: commands.Tx.Rollback) -> None:
    _require_tx(ch)
    ch.tx_publishes = []
    settles, ch.tx_settles = ch.tx_settles, []
    if settles:
        ch.unacked.restore([msg for _, msgs, _ in settles for msg in msgs])
    ch.reply(commands.Tx.RollbackOk())
