"""What a shaped link (tests/links.py) really gives, measured from inside two of its namespaces.

    python tests/linkprobe.py serve IP PORT           TCP: echo 20 one-byte pings, then time a bulk transfer in
    python tests/linkprobe.py send IP PORT NBYTES      → prints {"rtt_s": median ping, "bps": received bits/s}
    python tests/linkprobe.py udp-recv IP PORT SECONDS UDP: count datagrams for SECONDS → {"received": n}
    python tests/linkprobe.py udp-send IP PORT COUNT   send COUNT datagrams, spaced so the link never queues
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
import time

PINGS = 20


def serve(ip: str, port: int) -> None:
    with socket.create_server((ip, port)) as s:
        print("ready", flush=True)
        c, _ = s.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(PINGS):
            c.sendall(c.recv(1))
        n, got, t0 = int(c.recv(16).decode()), 0, 0.0
        while got < n:
            chunk = c.recv(1 << 16)
            if not chunk:
                break
            t0 = t0 or time.perf_counter()  # from the first byte: the transfer, not the handshake
            got += len(chunk)
        c.sendall(json.dumps({"bps": 8 * got / (time.perf_counter() - t0)}).encode())


def send(ip: str, port: int, nbytes: int) -> None:
    with socket.create_connection((ip, port), timeout=60) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(PINGS):
            t = time.perf_counter()
            c.sendall(b"x")
            c.recv(1)
            rtts.append(time.perf_counter() - t)
        c.sendall(str(nbytes).ljust(16).encode())
        c.sendall(b"\0" * nbytes)
        print(json.dumps({"rtt_s": statistics.median(rtts), **json.loads(c.recv(1024))}), flush=True)


def udp_recv(ip: str, port: int, seconds: float) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((ip, port))
        s.settimeout(0.2)
        print("ready", flush=True)
        n, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                s.recv(2048)
                n += 1
            except TimeoutError:
                pass
        print(json.dumps({"received": n}), flush=True)


def udp_send(ip: str, port: int, count: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(count):
            s.sendto(b"\0" * 100, (ip, port))
            time.sleep(0.001)


if __name__ == "__main__":
    mode, ip, port, arg = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    {"serve": lambda: serve(ip, port), "send": lambda: send(ip, port, int(arg[0])),
     "udp-recv": lambda: udp_recv(ip, port, float(arg[0])), "udp-send": lambda: udp_send(ip, port, int(arg[0]))}[mode]()
