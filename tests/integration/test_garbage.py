"""A neighbour that sends garbage is rejected with a specific gRPC status, named in the log,
and the peer keeps running (real peer process, a raw gRPC client as the bad neighbour)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from concord.core.config import load_config
from concord.core.models import FlatParams, build_model
from concord.peer import serde
from concord.peer.validate import STEP_WINDOW
from concord.protos import data_plane_pb2 as pb
from concord.protos import data_plane_pb2_grpc as pb_grpc
from tests.integration.peers import Peers, write_config

CONFIG = """epochs = 500
topology = "ring"
seed = 1
[dataset]
samples = 800
[model]
name = "mlp"
hidden = [8]
[control]
mode = "none"
"""


def _exchange(stub: pb_grpc.GossipStub, frames: list[pb.TensorFrame]) -> grpc.RpcError | None:
    try:
        for _ in stub.Exchange(iter(frames), timeout=10):
            pass
    except grpc.RpcError as exc:
        return exc
    return None


def test_garbage_frames_are_rejected_and_the_peer_keeps_running(tmp_path: Path) -> None:
    config = write_config(tmp_path / "run.toml", 2, CONFIG, deadline=0.2)
    text = config.read_text().replace("[network]", "[network]\nstartup_timeout = 1.0")
    config.write_text(text)
    cfg = load_config(config, environ={})
    model = build_model("mlp", 1, input_shape=(40,), num_classes=10, hidden=[8])
    flat = FlatParams(model)
    dim = flat.d
    peers = Peers(config, tmp_path, [0])  # we play peer 1
    try:
        metrics = tmp_path / "peer-0" / "metrics.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
            metrics.is_file() and metrics.read_text().count("\n") > 3
        ):
            time.sleep(0.1)
        step = json.loads(metrics.read_text().splitlines()[-1])["step"]
        channel = grpc.insecure_channel(cfg.network.addresses[0])  # type: ignore[index]
        stub = pb_grpc.GossipStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "concord.v1.Gossip"):
            status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert status.status == health_pb2.HealthCheckResponse.SERVING

        # frames before the handshake
        good = {"values": torch.zeros(dim)}

        def make(**kw: object) -> list[pb.TensorFrame]:
            args: dict = {
                "run_id": "itest",
                "sender": 1,
                "step": step,
                "round": step,
                "tensor_id": 0,
                "codec": "none",
                "dim": dim,
                "parts": good,
                "chunk_bytes": 1 << 20,
            }
            args.update(kw)
            return list(serde.frames(**args))

        err = _exchange(stub, make())
        assert err is not None
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED

        # a handshake with the wrong model is refused with the reason
        reply = stub.Hello(serde.hello_request("itest", 1, "0" * 64, "none"), timeout=10)
        assert not reply.accepted
        assert "fingerprint" in reply.reason
        reply = stub.Hello(serde.hello_request("itest", 1, flat.fingerprint(), "none"), timeout=10)
        assert reply.accepted, reply.reason

        nan = {"values": torch.full((dim,), float("nan"))}
        cases = [
            (make(parts=nan), grpc.StatusCode.INVALID_ARGUMENT, "non-finite"),
            (
                make(dim=dim + 1, parts={"values": torch.zeros(dim + 1)}),
                grpc.StatusCode.FAILED_PRECONDITION,
                "dimension",
            ),
            (make(step=step + 1000), grpc.StatusCode.FAILED_PRECONDITION, "too far ahead"),
            (make(sender=0), grpc.StatusCode.PERMISSION_DENIED, "before Hello"),
            (make(run_id="other"), grpc.StatusCode.PERMISSION_DENIED, "run"),
        ]
        shuffled = make(chunk_bytes=512)  # 4 chunks, the 2nd and 3rd swapped
        shuffled[1], shuffled[2] = shuffled[2], shuffled[1]
        cases += [
            (shuffled, grpc.StatusCode.INVALID_ARGUMENT, "out of order"),
            (
                make(parts={"values": torch.zeros(dim - 1), "extra": torch.zeros(1)}),
                grpc.StatusCode.INVALID_ARGUMENT,
                "expects parts",
            ),
            (make(codec="topk"), grpc.StatusCode.INVALID_ARGUMENT, "codec"),
        ]
        big = make(chunk_bytes=8 << 20, parts={"values": torch.zeros(dim)})
        # a chunk 1 MiB over the peer's chunk limit (network.chunk_bytes), under gRPC's message
        # limit (twice it): the servicer refuses it
        big[0].body = b"\0" * (cfg.network.chunk_bytes + (1 << 20))
        cases.append((big, grpc.StatusCode.RESOURCE_EXHAUSTED, "limit"))
        for frames, code, text in cases:
            err = _exchange(stub, frames)
            assert err is not None, text
            assert err.code() == code, (text, err)
            assert text in (err.details() or ""), (text, err.details())
        # bytes that are no protobuf at all
        raw = channel.stream_stream("/concord.v1.Gossip/Exchange")
        with pytest.raises(grpc.RpcError) as info:
            for _ in raw(iter([b"\xff\xfe\xfd" * 100]), timeout=10):
                pass
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert "malformed frame" in info.value.details()  # type: ignore[attr-defined]
        cases.append(([], grpc.StatusCode.INVALID_ARGUMENT, "malformed"))  # for the counts below

        # the same checks on the raw method (varint header length + FrameHeader + body), plus
        # messages whose framing is broken
        raw_cases = [
            ([serde.raw_message(f.header, f.body) for f in frames], code, text)
            for frames, code, text in cases
            if frames
        ]
        whole = [serde.raw_message(f.header, f.body) for f in make(chunk_bytes=512)]
        header0 = make(chunk_bytes=512)[0].header
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        raw_cases += [
            ([b""], invalid, "malformed frame"),
            ([b"\xff" * 12], invalid, "no varint header length"),
            ([b"\x7f" + b"\x00" * 20], invalid, "does not fit"),
            ([b"\x03\xff\xfe\xfd" + b"\x00" * 64], invalid, "not a concord.v1.FrameHeader"),
            ([*whole[:-1], whole[-1][:-4]], invalid, "do not add up"),  # last body too short
            ([*whole[:-1], whole[-1] + b"\x00" * 4], invalid, "exceeds the tensor"),
            # chunk 0 with its body cut short: chunk 1 no longer lands where chunk 0 ended
            ([serde.raw_message(header0, b"\x00" * 500), whole[1]], invalid, "expected 500"),
        ]
        exchange_raw = channel.stream_stream(
            "/concord.v1.Gossip/ExchangeRaw", response_deserializer=pb.Ack.FromString
        )
        for messages, code, text in raw_cases:
            with pytest.raises(grpc.RpcError) as info:
                for _ in exchange_raw(iter(messages), timeout=10):
                    pass
            assert info.value.code() == code, (text, info.value)  # type: ignore[attr-defined]
            assert text in (info.value.details() or ""), text  # type: ignore[attr-defined]
        # a good tensor on the raw method is acknowledged
        acks = list(exchange_raw(iter(whole), timeout=10))
        assert len(acks) == 1
        assert acks[0].status in (pb.ACK_OK, pb.ACK_LATE)
        cases += raw_cases

        # a NaN tensor for a round the peer has not reached yet: that round records peer 1 as
        # rejected (with the reason) rather than missing. The peer runs ahead quickly, so aim
        # STEP_WINDOW steps past its last record and retry until one lands in time.
        in_outcome, attempts = False, 0
        while not in_outcome and attempts < 40:
            ahead = json.loads(metrics.read_text().splitlines()[-1])["step"] + STEP_WINDOW
            err = _exchange(stub, make(step=ahead, round=ahead, parts=nan))
            attempts += 1
            assert err is not None
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            time.sleep(0.2)
            in_outcome = any(
                1 in m.get("rejected", [])
                for m in map(json.loads, metrics.read_text().splitlines())
                if m["kind"] == "step"
            )
        assert in_outcome
        channel.close()

        # the peer is still training (its step keeps advancing), then stops cleanly
        before = json.loads(metrics.read_text().splitlines()[-1])["step"]
        time.sleep(1.0)
        after = json.loads(metrics.read_text().splitlines()[-1])["step"]
        assert after > before
        peers.procs[0].send_signal(signal.SIGTERM)
        assert peers.wait(timeout=60) == {0: 0}
        log = [
            json.loads(line)
            for line in (tmp_path / "peer-0" / "log.jsonl").read_text().splitlines()
        ]
        rejected = [e for e in log if e["event"] == "frame.rejected"]
        assert len(rejected) == len(cases) + 1 + attempts
        assert all(e["reason"] for e in rejected)
        # the sender is named by id, or by address when not even one frame decoded
        assert all(e["sender"] in (0, 1) or "127.0.0.1" in e["remote"] for e in rejected)
        summary = json.loads((tmp_path / "peer-0" / "summary.json").read_text())
        # every rejected stream plus the refused handshake (wrong fingerprint)
        assert sum(summary["frames_rejected"].values()) == len(cases) + 1 + attempts + 1
    finally:
        peers.kill_all()


@pytest.mark.parametrize("peers_count", [2])
def test_static_peer_refuses_consensus_control_without_orchestrator(
    tmp_path: Path, peers_count: int
) -> None:
    config = write_config(tmp_path / "run.toml", peers_count, "epochs = 1\n")
    with Peers(config, tmp_path, [0]) as peers:
        codes = peers.wait(timeout=60)
    assert codes == {0: 2}
    assert "needs the orchestrator" in (tmp_path / "peer-0.stderr").read_text()
