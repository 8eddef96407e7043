"""bench/placer_floor.py, the gRPC floor under bench/placer.py: a real server answering every Pick with
the reply it was given, whatever the request, on a Pick call or on PickStream."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc

from bench.placer_procs import start_floor
from hanzo.inference.v1 import placer_pb2, placer_pb2_grpc
from services.gateway.placer_link import PlacerLink


async def test_the_floor_answers_every_pick_with_its_fixed_reply(tmp_path: Path) -> None:
    reply = placer_pb2.PickReply(node_id="n-7", address="10.0.0.7:50061", considered=8000)
    reply.candidates.add(node_id="n-7", total=0.93)
    path = tmp_path / "reply.bin"
    path.write_bytes(reply.SerializeToString())
    floor, address = start_floor(path, os.sched_getaffinity(0), tmp_path / "floor.log")
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = placer_pb2_grpc.PlacerStub(channel)
            for request in (
                placer_pb2.PickRequest(model="llama-8b", prompt_tokens=900),
                placer_pb2.PickRequest(model="unknown", exclude_nodes=["n-7"]),
            ):
                assert await stub.Pick(request, timeout=10) == reply
            link = PlacerLink(stub)  # each pick on one PickStream call, as bench/placer.py times it
            request = placer_pb2.PickRequest(model="llama-8b")
            picks = await asyncio.gather(*(link.pick(request, 10.0, {}) for _ in range(40)))
            await link.close()
            assert picks == [reply] * 40
    finally:
        floor.stop()
