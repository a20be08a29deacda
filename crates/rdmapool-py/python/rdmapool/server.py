"""``python -m rdmapool.server``: a memory server in a process of its own, until SIGTERM or
Ctrl-C. It prints one line of JSON once it listens, ``{"addr": "ip:port", "node": N}``, so
a parent process can read where to connect::

    python -m rdmapool.server --node 1 --size 64M --listen 127.0.0.1:0
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from ._rdmapool import MemoryServer

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size_arg(text: str) -> int:
    """``64M``, ``1G``, ``4096``: bytes."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _UNITS and t[-1:] != "" else ""
    try:
        n = int(t[: len(t) - len(unit)]) * _UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want a size such as 64M or 1G") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: want a positive size")
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rdmapool.server", description=__doc__)
    p.add_argument("--node", type=int, default=1, help="the node id (unique in the cluster)")
    p.add_argument("--size", type=size_arg, default=64 << 20, help="bytes exported (64M)")
    p.add_argument("--listen", default="127.0.0.1:0", help="ip:port (port 0: any free)")
    p.add_argument("--chunk-size", type=size_arg, default=1 << 20, help="allocation chunk (1M)")
    p.add_argument("--lease", type=float, default=2.0, help="client lease, seconds")
    p.add_argument("--key-file", help="the cluster key's file")
    p.add_argument("--isolated", action="store_true", help="confine each client to its own memory")
    p.add_argument("--provider", default="soft", choices=["soft", "verbs"])
    p.add_argument("--device", help="the verbs device")
    a = p.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with MemoryServer(
        a.size,
        node=a.node,
        listen=a.listen,
        chunk_size=a.chunk_size,
        lease=a.lease,
        key_file=a.key_file,
        isolated=a.isolated,
        provider=a.provider,
        device=a.device,
    ) as server:
        print(json.dumps({"addr": server.addr, "node": server.node}), flush=True)
        while not stop.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
