"""``warren-server`` and ``python -m warren.broker``: the entry point is server/main.py's."""

from warren.broker.server.main import main

if __name__ == "__main__":
    raise SystemExit(main())
