"""An AMQP endpoint that throws publishes away: how fast a publisher can go on this machine.

    python tests/benchmarks/null_broker.py [--port 5690] [--interval 1]

It answers the handshake and the few methods a load generator sends before and after
publishing (channel.open, queue.declare/purge/delete, confirm.select, basic.qos,
channel.close, connection.close). From the first basic.publish on, it reads the socket
once every ``--interval`` milliseconds (as Warren's read coalescing does under a stream
of publishes) and drops the bytes unparsed, watching only for channel.close and
connection.close. It stores nothing, routes nothing and confirms nothing: what a
publisher reaches against it is the publisher's own ceiling, the most any broker could
show it (docs/performance.md, "S7's ceiling"). Publishing with confirms against it never
gets them.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time

from pamqp import commands, frame
from pamqp.base import Frame

# channel.close (class 20, method 40) and connection.close (10, 50) as they follow a method
# frame's header; a hit counts once its frame header and frame-end octet check out, so that
# a message body that happens to hold these bytes does not end the run
CLOSING = (b"\x00\x14\x00\x28", b"\x00\x0a\x00\x32")
FRAME_HEADER = 7
FRAME_END = 0xCE
FRAME_METHOD = 1
MAX_CLOSE = 4 + 2 + 256 + 4  # ids, reply code, reply text, failing method


def reply(method: Frame) -> Frame | None:
    """What the null broker answers to a method before publishing starts."""
    if isinstance(method, commands.Connection.StartOk):
        return commands.Connection.Tune(channel_max=2047, frame_max=131072, heartbeat=0)
    if isinstance(method, commands.Connection.Open):
        return commands.Connection.OpenOk()
    if isinstance(method, commands.Channel.Open):
        return commands.Channel.OpenOk()
    if isinstance(method, commands.Queue.Declare):
        return commands.Queue.DeclareOk(method.queue or "amq.gen-null", 0, 0)
    if isinstance(method, commands.Queue.Purge):
        return commands.Queue.PurgeOk(0)
    if isinstance(method, commands.Queue.Delete):
        return commands.Queue.DeleteOk(0)
    if isinstance(method, commands.Confirm.Select):
        return commands.Confirm.SelectOk()
    if isinstance(method, commands.Basic.Qos):
        return commands.Basic.QosOk()
    if isinstance(method, commands.Channel.Close):
        return commands.Channel.CloseOk()
    return None


def serve(sock: socket.socket, interval: float) -> None:
    with sock:
        if len(sock.recv(8)) < 8:  # the protocol header
            return
        start = commands.Connection.Start(
            server_properties={"product": "null broker"}, mechanisms="PLAIN", locales="en_US"
        )
        sock.sendall(frame.marshal(start, 0))
        pending = b""
        chunk = bytearray(1 << 20)
        while True:
            while pending:
                try:
                    used, channel, method = frame.unmarshal(pending)
                except Exception:  # an incomplete frame: read on
                    break
                pending = pending[used:]
                if isinstance(method, commands.Connection.Close):
                    sock.sendall(frame.marshal(commands.Connection.CloseOk(), 0))
                    return
                if isinstance(method, commands.Basic.Publish):
                    rest = discard(sock, chunk, interval, pending)
                    if rest is None:
                        return
                    pending = rest
                    continue
                answer = reply(method) if isinstance(method, Frame) else None
                if answer is not None:
                    sock.sendall(frame.marshal(answer, channel))
            data = sock.recv(65536)
            if not data:
                return
            pending += data


def discard(sock: socket.socket, chunk: bytearray, interval: float, data: bytes) -> bytes | None:
    """Drop ``data`` and what arrives after it until channel.close or connection.close;
    returns the bytes from that frame on, or None once the client has closed the socket."""
    while True:
        at, whole = closing_frame(data)
        if whole:
            return data[at:]
        # a closing frame may straddle two reads: its start is kept for the next
        tail = data[at:] if at >= 0 else data[-(FRAME_HEADER + len(CLOSING[0])) :]
        time.sleep(interval)
        size = sock.recv_into(chunk)
        if not size:
            return None
        data = tail + chunk[:size]


def closing_frame(data: bytes) -> tuple[int, bool]:
    """Where the first channel.close or connection.close frame in ``data`` starts (-1:
    none), and whether it is all there (else the read cut it off)."""
    found = (-1, False)
    for ids in CLOSING:
        hit = data.find(ids, FRAME_HEADER)
        while hit >= 0 and (found[0] < 0 or hit - FRAME_HEADER < found[0]):
            at = hit - FRAME_HEADER
            size = int.from_bytes(data[at + 3 : at + 7], "big")
            on_channel_0 = data[at + 1 : at + 3] == b"\x00\x00"
            if (
                data[at] == FRAME_METHOD
                and size <= MAX_CLOSE
                and (ids == CLOSING[0] or on_channel_0)
            ):
                end = at + FRAME_HEADER + size
                if end >= len(data):
                    found = (at, False)
                    break
                if data[end] == FRAME_END:
                    found = (at, True)
                    break
            hit = data.find(ids, hit + 1)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=5690)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--interval", type=float, default=1.0, help="ms between reads")
    args = parser.parse_args()
    listener = socket.create_server((args.bind, args.port), reuse_port=False, backlog=64)
    print(f"null broker on {args.bind}:{args.port}", flush=True)
    while True:
        sock, _ = listener.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(sock, args.interval / 1000), daemon=True).start()


if __name__ == "__main__":
    main()
