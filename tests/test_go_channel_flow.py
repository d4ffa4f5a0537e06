"""channel.flow from RabbitMQ's Go client (amqp091-go, Debian's package): active=true gets
flow-ok, active=false closes the connection with 540 as RabbitMQ 4.3 does
(rabbit_channel.erl, handle_method channel.flow). Passes against RabbitMQ 3.10 too."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SOURCE = Path(__file__).parent / "clients" / "go_channel_flow" / "main.go"


def test_go_client_channel_flow(amqp_url: str, tmp_path: Path) -> None:
    # Debian installs the client's source under /usr/share/gocode: a GOPATH build, offline
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": "/usr/share/gocode"}
    env.setdefault("GOCACHE", str(tmp_path / "gocache"))
    binary = tmp_path / "go_channel_flow"
    subprocess.run(["go", "build", "-o", str(binary), str(SOURCE)], env=env, check=True)
    done = subprocess.run(
        [str(binary), amqp_url], capture_output=True, text=True, timeout=30, check=True
    )
    assert done.stdout.splitlines() == [
        "flow true: <nil>",
        "flow false: 540 NOT_IMPLEMENTED - active=false",
        "connection closed: 540 NOT_IMPLEMENTED - active=false",
    ]
