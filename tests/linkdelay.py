"""The delay, jitter and loss of shaped links (tests/links.py), in user space: packets the hub forwards wait here.

This machine's kernel, like many cloud and micro-VM kernels, has no `netem`; its `tbf` shapes rates but nothing in
tc delays a packet. So the hub namespace sends every forwarded packet to NFQUEUE (iptables, `--queue-bypass`: with
this process gone, packets pass undelayed rather than vanish), and this process, reading that queue over raw
netlink, gives each packet its verdict when its time comes: one-way delay = a quarter of each end's round trip
(source's and destination's), plus normal jitter, never earlier than the previous packet of the same pair (jitter
must not reorder a TCP stream: the receiver would take it for loss); dropped with each end's loss probability.

    python tests/linkdelay.py QUEUE '{"10.78.1.2": [rtt_s, jitter_s, loss], …}' SEED

Prints "ready" once bound. Only the first 20 bytes of each packet (its IPv4 header) are copied to user space.
"""

from __future__ import annotations

import heapq
import json
import random
import select
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
MSG_PACKET, MSG_VERDICT, MSG_CONFIG = 0, 1, 2
CFG_CMD, CFG_PARAMS, CFG_QUEUE_MAXLEN = 1, 2, 3
CMD_BIND = 1
COPY_PACKET = 2
ATTR_PACKET_HDR, ATTR_VERDICT_HDR, ATTR_PAYLOAD = 1, 2, 10
NF_DROP, NF_ACCEPT = 0, 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
SOL_NETLINK, NETLINK_NO_ENOBUFS = 270, 5
SO_RCVBUFFORCE = 33


def _attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _message(msg: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST) -> bytes:
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg, flags, 0, 0) + body


def _attrs(data: bytes) -> dict[int, bytes]:
    out, i = {}, 0
    while i + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, i)
        if length < 4:
            break
        out[kind & 0x3FFF] = data[i + 4:i + length]
        i += (length + 3) & ~3
    return out


class Delayer:
    def __init__(self, queue: int, ends: dict[str, tuple[float, float, float]], seed: int = 0):
        self.queue, self.ends, self.rng = queue, ends, random.Random(seed)
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        # forced past rmem_max: a queue the kernel cannot hand us is dropped packets the profile did not ask for
        self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.sock.bind((0, 0))
        self.held: list[tuple[float, int, int]] = []  # (release time, sequence, packet id)
        self.last: dict[tuple[bytes, bytes], float] = {}
        self._seq = 0

    def bind(self) -> None:
        """Bind the queue; each step acknowledged, so that "ready" means bound (an error raises OSError)."""
        cmd = _attr(CFG_CMD, struct.pack("=BxH", CMD_BIND, socket.htons(socket.AF_INET)))
        params = _attr(CFG_PARAMS, struct.pack(">IB", 20, COPY_PACKET))
        for attrs in (cmd, params + _attr(CFG_QUEUE_MAXLEN, struct.pack(">I", 20000))):
            self.sock.send(_message(MSG_CONFIG, self.queue, attrs, NLM_F_REQUEST | NLM_F_ACK))
            ack = self.sock.recv(4096)
            length, kind = struct.unpack_from("=IH", ack, 0)
            if kind != NLMSG_ERROR or struct.unpack_from("=i", ack, 16)[0] != 0:
                code = -struct.unpack_from("=i", ack, 16)[0] if kind == NLMSG_ERROR else 0
                raise OSError(code, f"nfqueue did not accept the configuration (message type {kind})")

    def verdict(self, packet_id: int, verdict: int) -> None:
        self.sock.send(_message(MSG_VERDICT, self.queue, _attr(ATTR_VERDICT_HDR, struct.pack(">II", verdict,
                                                                                               packet_id))))

    def _delay_of(self, src: bytes, dst: bytes) -> float | None:
        """When a packet from src to dst leaves, from now; None: dropped."""
        a = self.ends.get(socket.inet_ntoa(src), (0.0, 0.0, 0.0))
        b = self.ends.get(socket.inet_ntoa(dst), (0.0, 0.0, 0.0))
        if self.rng.random() < a[2] + b[2]:
            return None
        jitter = (a[1] + b[1]) / 4
        return max(0.0, (a[0] + b[0]) / 4 + (self.rng.gauss(0.0, jitter) if jitter else 0.0))

    def _receive(self, data: bytes, now: float) -> None:
        i = 0
        while i + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, i)
            if length < 16:
                break
            if kind == (NFNL_SUBSYS_QUEUE << 8) | MSG_PACKET:
                attrs = _attrs(data[i + 20:i + length])
                packet_id = struct.unpack(">I", attrs[ATTR_PACKET_HDR][:4])[0]
                header = attrs.get(ATTR_PAYLOAD, b"")
                if len(header) < 20:
                    self.verdict(packet_id, NF_ACCEPT)
                else:
                    src, dst = header[12:16], header[16:20]
                    delay = self._delay_of(src, dst)
                    if delay is None:
                        self.verdict(packet_id, NF_DROP)
                    else:
                        at = max(now + delay, self.last.get((src, dst), 0.0))
                        self.last[(src, dst)] = at
                        self._seq += 1
                        heapq.heappush(self.held, (at, self._seq, packet_id))
            elif kind == NLMSG_ERROR and struct.unpack_from("=i", data, i + 16)[0] != 0:
                raise OSError(-struct.unpack_from("=i", data, i + 16)[0], "nfqueue refused a message")
            i += (length + 3) & ~3

    def run(self) -> None:
        while True:
            now = time.monotonic()
            while self.held and self.held[0][0] <= now:
                self.verdict(heapq.heappop(self.held)[2], NF_ACCEPT)
            timeout = max(0.0, self.held[0][0] - now) if self.held else 1.0
            if select.select([self.sock], [], [], timeout)[0]:
                self._receive(self.sock.recv(1 << 20), time.monotonic())


def main() -> None:
    queue, ends, seed = int(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
    d = Delayer(queue, {ip: tuple(v) for ip, v in ends.items()}, seed)
    d.bind()
    print("ready", flush=True)
    d.run()


if __name__ == "__main__":
    main()
