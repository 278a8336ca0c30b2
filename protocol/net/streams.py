"""Binary libp2p streams to and from peers over this peer's p2pd: the seam the round's messages travel through."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from hivemind.p2p import P2P, PeerID

from pathswarm.protocol.wire import NotServingYetError, UnreachableError

StreamHandler = Callable[[str, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
"""(the caller's peer id, as libp2p authenticated it; reader; writer) → None. It must close the writer."""


class PeerStreams:
    """Binary libp2p streams to and from peers, over this peer's p2pd. Use it on the event loop that
    made it (`SwarmNet.streams()`)."""

    def __init__(self, p2p: P2P):
        self._p2p = p2p

    async def serve(self, name: str, handler: StreamHandler) -> None:
        """Answer streams opened to `name` with `handler`."""

        async def on_stream(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await handler(info.peer_id.to_base58(), reader, writer)

        await self._p2p.add_binary_stream_handler(name, on_stream)

    async def serve_with_address(self, name: str, handler: Callable[[str, str, asyncio.StreamReader,
                                                                      asyncio.StreamWriter], Awaitable[None]]) -> None:
        """Like `serve`, the handler also getting the multiaddr the caller's connection comes from (as p2pd saw
        it: behind NAT, the router's address)."""

        async def on_stream(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await handler(info.peer_id.to_base58(), str(info.addr), reader, writer)

        await self._p2p.add_binary_stream_handler(name, on_stream)

    async def open(self, peer_id: str, name: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Open a stream to `peer_id`'s handler `name`; NotServingYetError if the peer is up without that handler,
        other (assorted) types if it cannot be reached."""
        try:
            _, reader, writer = await self._p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), name)
        except Exception as e:
            if "protocols not supported" in str(e):  # p2pd's words when the protocol negotiation finds no handler
                raise NotServingYetError(f"{peer_id[-8:]} does not serve {name} (yet)") from None
            if "failed to dial" in str(e):  # p2pd's words when no address of the peer answers
                raise UnreachableError(f"{peer_id[-8:]} cannot be reached: {str(e).splitlines()[0][:200]}") from None
            raise
        return reader, writer
