"""The floor under bench/placer.py's gRPC figures: a grpc.aio server built as the placer's is (the same
server options and binding, services/common/grpc_server.py) whose Pick, and each pick on PickStream, does
no work at all, answering with one fixed reply (a real reply the placer gave, read from --reply, so the
bytes on the wire are the same). Whatever latency 32 callers in flight see against it is the cost of
gRPC, Python and this machine alone: no pick code can get the placer below it. Prints
"FLOOR_READY address=HOST:PORT"; stops on SIGTERM/SIGINT.

    .venv/bin/python -m bench.placer_floor --reply FILE
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from hanzo.inference.v1 import placer_pb2, placer_pb2_grpc
from services.common.grpc_server import bind, new_server


class FixedPick(placer_pb2_grpc.PlacerServicer):
    def __init__(self, reply: placer_pb2.PickReply) -> None:
        self.reply = reply

    async def Pick(
        self, request: placer_pb2.PickRequest, context: grpc.aio.ServicerContext
    ) -> placer_pb2.PickReply:
        return self.reply

    async def PickStream(
        self, requests: AsyncIterator[placer_pb2.PickCalls], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[placer_pb2.PickAnswers]:
        async for calls in requests:
            answers = [placer_pb2.PickAnswer(call_id=c.call_id, reply=self.reply) for c in calls.calls]
            yield placer_pb2.PickAnswers(answers=answers)


async def serve(reply: placer_pb2.PickReply) -> None:
    server = new_server()
    placer_pb2_grpc.add_PlacerServicer_to_server(FixedPick(reply), server)
    address = bind(server, "127.0.0.1", 0)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"FLOOR_READY address={address}", flush=True)
    await stop.wait()
    await server.stop(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reply", type=Path, required=True, help="a serialized PickReply")
    args = parser.parse_args()
    asyncio.run(serve(placer_pb2.PickReply.FromString(args.reply.read_bytes())))


if __name__ == "__main__":
    main()
