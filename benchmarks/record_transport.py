"""Which process boundary the engine's step records cross: a shared-memory
ring, a multiprocessing pipe, or a non-blocking AF_UNIX datagram socket.

For each transport, one sender thread (standing in for the engine thread) sends
``--records`` step records of ``--batch`` sequences (about the size instrument/records/format.py
packs: 64 B + 17 B per sequence) as fast as it can to a reader in another process, and
prints the sender's thread CPU per record (µs, what the engine thread would pay), records
offered per second until the reader has drained (offered, not delivered, where some were
dropped), and how many the sender dropped at a full buffer (it never waits; the pipe cannot
drop: it blocks). A sender this fast outruns any Python reader; an engine sends at most a few
thousand steps a second. Not measured here: a send that wakes a sleeping reader costs the
sender far more (~40 µs of engine-thread CPU in benchmarks/tracing_cost.py on a 2-core box),
which is why the engine sends its records every 32 KiB / 50 ms, not every step.

Usage: python benchmarks/record_transport.py [--records 20000] [--batch 64]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import struct
import time
from multiprocessing import shared_memory

RING_BYTES = 4 * 2**20


def _payload(batch: int) -> bytes:
    return bytes(64 + 17 * batch)


def _ring_reader(name: str, stop: mp.Event) -> None:  # type: ignore[valid-type]  # mp.Event is a factory function, the annotation names what it makes
    shm = shared_memory.SharedMemory(name=name)
    buf = shm.buf
    read = 0
    while True:
        head = struct.unpack_from("<Q", buf, 0)[0]
        if head == read:
            if stop.is_set():
                break
            time.sleep(0.0005)
            continue
        while read < head:  # records: u32 length + bytes, wrapping at the ring's end
            pos = 16 + read % (RING_BYTES - 16)
            length = struct.unpack_from("<I", buf, pos)[0]
            bytes(buf[pos + 4:pos + 4 + length])
            read += 4 + length
        struct.pack_into("<Q", buf, 8, read)
    del buf
    shm.close()


def _ring(records: int, payload: bytes) -> tuple[float, float, int]:
    shm = shared_memory.SharedMemory(create=True, size=RING_BYTES)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    proc = ctx.Process(target=_ring_reader, args=(shm.name, stop))
    proc.start()
    buf = shm.buf
    struct.pack_into("<QQ", buf, 0, 0, 0)
    time.sleep(1.0)
    head = dropped = 0
    size = RING_BYTES - 16
    n = len(payload)
    cpu0, wall0 = time.thread_time_ns(), time.perf_counter()
    for _ in range(records):
        read = struct.unpack_from("<Q", buf, 8)[0]
        pos = 16 + head % size
        if head + 4 + n - read > size or pos + 4 + n > RING_BYTES:  # full (or would wrap: skip the record)
            dropped += 1
            continue
        struct.pack_into("<I", buf, pos, n)
        buf[pos + 4:pos + 4 + n] = payload
        head += 4 + n
        struct.pack_into("<Q", buf, 0, head)
    cpu, wall = time.thread_time_ns() - cpu0, time.perf_counter() - wall0
    while struct.unpack_from("<Q", buf, 8)[0] != head and proc.is_alive():
        time.sleep(0.001)
    wall = time.perf_counter() - wall0
    stop.set()
    proc.join(10)
    del buf
    shm.close()
    shm.unlink()
    return cpu / records / 1e3, records / wall, dropped


def _pipe_reader(conn: mp.connection.Connection) -> None:
    while True:
        data = conn.recv_bytes()
        if data == b"":
            break


def _pipe(records: int, payload: bytes) -> tuple[float, float, int]:
    ctx = mp.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_pipe_reader, args=(reader,))
    proc.start()
    time.sleep(1.0)
    cpu0, wall0 = time.thread_time_ns(), time.perf_counter()
    for _ in range(records):
        writer.send_bytes(payload)  # blocks when the pipe is full: no drop possible
    cpu = time.thread_time_ns() - cpu0
    writer.send_bytes(b"")
    proc.join(30)
    wall = time.perf_counter() - wall0
    return cpu / records / 1e3, records / wall, 0


def _dgram_reader(sock: socket.socket) -> None:
    while True:
        data = sock.recv(1 << 20)
        if data == b"end":
            break


def _dgram(records: int, payload: bytes, kind: int = socket.SOCK_DGRAM) -> tuple[float, float, int]:
    ctx = mp.get_context("spawn")
    sender, receiver = socket.socketpair(socket.AF_UNIX, kind)
    sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 2**20)
    proc = ctx.Process(target=_dgram_reader, args=(receiver,))
    proc.start()
    receiver.close()
    sender.setblocking(False)
    time.sleep(1.0)
    dropped = 0
    send = sender.send
    cpu0, wall0 = time.thread_time_ns(), time.perf_counter()
    for _ in range(records):
        try:
            send(payload)
        except BlockingIOError:
            dropped += 1
    cpu = time.thread_time_ns() - cpu0
    sender.setblocking(True)
    sender.send(b"end")
    proc.join(30)
    wall = time.perf_counter() - wall0
    sender.close()
    return cpu / records / 1e3, records / wall, dropped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Step-record transports: sender CPU per record, records/s.")
    parser.add_argument("--records", type=int, default=20000, help="records per transport (default 20000)")
    parser.add_argument("--batch", type=int, default=64, help="sequences per step record (default 64)")
    args = parser.parse_args(argv)
    payload = _payload(args.batch)
    print(f"{args.records} records of {len(payload)} B (batch {args.batch}); load {os.getloadavg()[0]:.2f}")
    print(f"{'transport':<23}{'sender us/rec':>14}{'records/s':>12}{'dropped':>9}")
    for name, run in (("shared-memory ring", _ring), ("multiprocessing pipe", _pipe), ("unix datagram socket", _dgram),
                            ("unix seqpacket socket", lambda r, p: _dgram(r, p, socket.SOCK_SEQPACKET))):
        us, rate, dropped = run(args.records, payload)
        print(f"{name:<23}{us:>14.2f}{rate:>12,.0f}{dropped:>9}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
