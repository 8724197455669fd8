"""What one message on the exporter socket costs the sending thread, by size, caches cold.

The vLLM plugin's sends (instrument/vllm/sink.py) hand their packed rows to the span exporter
process over an ``AF_UNIX`` ``SOCK_SEQPACKET`` socket pair (instrument/records/exporter_process.py:
4 MiB buffers, the sender never blocks). This times one ``sendmsg`` of each size with the
thread's CPU clock after ``--evict-mib`` of memory streamed through the caches (a model step's
stand-in), then a second one at once (warm), against a child process that waits in ``recv``
(woken by every message, as the exporter process is) or, with ``--receiver sleep``, one that
reads every 50 ms without waiting on the socket. Prints the medians, µs.

Run: .venv/bin/python benchmarks/send_size.py --sends 200
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

SIZES = (4096, 32768, 65536, 262144)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="example: .venv/bin/python benchmarks/send_size.py --sends 200")
    parser.add_argument("--sends", type=int, default=200, help="timed sends per size (default 200)")
    parser.add_argument("--evict-mib", type=int, default=32, help="memory streamed before each cold send, MiB")
    parser.add_argument("--receiver", choices=("recv", "sleep"), default="recv",
                        help="the child waits in recv (default) or reads every 50 ms")
    args = parser.parse_args()
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    parent.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    child.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    pid = os.fork()
    if pid == 0:  # the receiver: reads until the one-byte b"x" message
        parent.close()
        buf = bytearray(1 << 21)
        if args.receiver == "sleep":
            child.setblocking(False)
        while True:
            if args.receiver == "sleep":
                time.sleep(0.05)
            while True:  # everything there (recv: one message, waiting for it)
                try:
                    n = child.recv_into(buf)
                except BlockingIOError:
                    break
                if n == 0 or buf[:n] == b"x":
                    os._exit(0)
                if args.receiver == "recv":
                    break
    child.close()
    parent.setblocking(False)
    junk = bytearray(args.evict_mib << 20)
    line = b"\1" * len(junk[::64])
    print(f"receiver {args.receiver}; {args.sends} sends per size after streaming {args.evict_mib} MiB")
    print(f"{'bytes':>8}  {'cold µs':>8}  {'warm µs':>8}")
    for size in SIZES:
        payload = os.urandom(size)
        cold, warm = [], []
        for _ in range(args.sends):
            junk[::64] = line  # one write per cache line
            t = time.thread_time_ns()
            parent.sendmsg((b"\0\0\0\0", payload))
            cold.append(time.thread_time_ns() - t)
            t = time.thread_time_ns()
            parent.sendmsg((b"\0\0\0\0", payload))
            warm.append(time.thread_time_ns() - t)
            time.sleep(0.002)  # the receiver drains
        print(f"{size:>8}  {statistics.median(cold) / 1e3:>8.1f}  {statistics.median(warm) / 1e3:>8.1f}")
    parent.setblocking(True)
    parent.send(b"x")
    os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
