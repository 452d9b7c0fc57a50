"""A user-space Ethernet hub between network namespaces, with per-host delay and loss.

    python tests/net_relay.py NS0 NS1 ...      (root; started by tests/netns.py)

For kernels without the netem qdisc: it creates a TAP device `eth0` inside
each namespace (the devices vanish with this process), forwards frames between
them like a learning switch, and applies to every frame to or from host i the
delay and loss set for it. Commands on stdin, one per line:

    impair <host> <delay_ms> <loss_percent>
    quit

It prints "READY" once every device exists. Frames are delayed by a heap
ordered by due time, so the order of frames on one path is kept (netem keeps
it too when the delay has no jitter).
"""

import ctypes
import fcntl
import heapq
import os
import random
import select
import struct
import sys
import time

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path})")
    finally:
        os.close(fd)


def open_tap(namespace: str, home: str, name: str = "eth0") -> int:
    """A TAP device `name` inside `namespace`; returns its file descriptor."""
    _setns(f"/var/run/netns/{namespace}")
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI))
        return fd
    finally:
        _setns(home)


def main(namespaces) -> None:
    home = f"/proc/{os.getpid()}/ns/net"
    home_fd = os.open(home, os.O_RDONLY)  # keeps our own namespace reachable by path below
    home = f"/proc/self/fd/{home_fd}"
    taps = [open_tap(ns, home) for ns in namespaces]
    host_of_fd = {fd: i for i, fd in enumerate(taps)}
    delay = [0.0] * len(taps)
    loss = [0.0] * len(taps)
    where = {}  # MAC -> host
    due = []  # (time, seq, out fd, frame)
    seq = 0
    rng = random.Random(12345)
    print("READY", flush=True)
    stdin = sys.stdin.fileno()
    while True:
        timeout = max(0.0, due[0][0] - time.monotonic()) if due else 1.0
        readable, _, _ = select.select([stdin, *taps], [], [], timeout)
        for fd in readable:
            if fd == stdin:
                line = sys.stdin.readline()
                words = line.split()
                if not words or words[0] == "quit":
                    return
                if words[0] == "impair":
                    host = int(words[1])
                    delay[host], loss[host] = float(words[2]) / 1000.0, float(words[3]) / 100.0
                    print(f"IMPAIRED {host}", flush=True)
                continue
            src = host_of_fd[fd]
            while True:
                try:
                    frame = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if len(frame) < 14:
                    continue
                where[frame[6:12]] = src
                dst_host = where.get(frame[0:6])
                targets = (
                    [dst_host]
                    if dst_host is not None and not frame[0] & 1
                    else [h for h in range(len(taps)) if h != src]
                )
                now = time.monotonic()
                for dst in targets:
                    if dst == src:
                        continue
                    lost = loss[src] + loss[dst] - loss[src] * loss[dst]
                    if lost and rng.random() < lost:
                        continue
                    seq += 1
                    heapq.heappush(due, (now + delay[src] + delay[dst], seq, taps[dst], frame))
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, _, out, frame = heapq.heappop(due)
            try:
                os.write(out, frame)
            except (BlockingIOError, OSError):
                pass  # a full or downed device drops the frame, as a wire would


if __name__ == "__main__":
    main(sys.argv[1:])
