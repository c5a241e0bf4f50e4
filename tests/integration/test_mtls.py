"""Peers under mTLS: they train together; a client without a certificate from the run CA, with
one from another CA, or in plaintext is refused, and the peer keeps running."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import grpc
import pytest
import torch

from concord.core.config import load_config
from concord.core.models import FlatParams, build_model
from concord.peer import serde
from concord.peer.certs import init_ca, issue_peer
from concord.protos import data_plane_pb2 as pb
from concord.protos import data_plane_pb2_grpc as pb_grpc
from tests.integration.peers import Peers, write_config

BASE = """epochs = {epochs}
topology = "ring"
[dataset]
samples = 800
[model]
name = "mlp"
hidden = [8]
[control]
mode = "none"
"""


def _tls_config(tmp_path: Path, epochs: int, startup: float = 30.0) -> Path:
    certs = tmp_path / "certs"
    init_ca(certs, run_id="itest")
    for i in range(2):
        issue_peer(certs, i)
    config = write_config(tmp_path / "run.toml", 2, BASE.format(epochs=epochs))
    config.write_text(
        config.read_text().replace("[network]", f"[network]\nstartup_timeout = {startup}")
        + f'\n[network.tls]\nca = "{certs}/ca.crt"\ncert = "{certs}/peer-{{id}}.crt"\n'
        f'key = "{certs}/peer-{{id}}.key"\n'
    )
    return config


def test_two_peers_train_over_mtls(tmp_path: Path) -> None:
    config = _tls_config(tmp_path, epochs=2)
    peers = Peers(config, tmp_path, [0, 1])
    try:
        assert peers.wait(timeout=120) == {0: 0, 1: 0}
    finally:
        peers.kill_all()
    for i in (0, 1):
        summary = json.loads((tmp_path / f"peer-{i}" / "summary.json").read_text())
        assert summary["completed"]
        assert summary["tensors_received"] == summary["steps"]  # one neighbour, every step


def _hello(channel: grpc.Channel, fingerprint: str) -> grpc.RpcError | bool:
    stub = pb_grpc.GossipStub(channel)
    try:
        reply = stub.Hello(serde.hello_request("itest", 1, fingerprint, "none"), timeout=5)
    except grpc.RpcError as exc:
        return exc
    return bool(reply.accepted)


@pytest.mark.parametrize("who", ["no-cert", "other-ca", "plaintext"])
def test_clients_without_a_valid_certificate_are_refused(tmp_path: Path, who: str) -> None:
    config = _tls_config(tmp_path, epochs=500, startup=1.0)
    cfg = load_config(config, environ={})
    fingerprint = FlatParams(
        build_model("mlp", 1, input_shape=(40,), num_classes=10, hidden=[8])
    ).fingerprint()
    address = cfg.network.addresses[0]  # type: ignore[index]
    certs = tmp_path / "certs"
    peers = Peers(config, tmp_path, [0])
    try:
        metrics = tmp_path / "peer-0" / "metrics.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (metrics.is_file() and metrics.stat().st_size):
            time.sleep(0.1)
        ca = (certs / "ca.crt").read_bytes()
        if who == "no-cert":
            creds = grpc.ssl_channel_credentials(ca)
            channel = grpc.secure_channel(address, creds)
        elif who == "other-ca":
            init_ca(tmp_path / "evil", run_id="evil")
            evil = issue_peer(tmp_path / "evil", 1)
            creds = grpc.ssl_channel_credentials(ca, evil.key.read_bytes(), evil.cert.read_bytes())
            channel = grpc.secure_channel(address, creds)
        else:
            channel = grpc.insecure_channel(address)
        result = _hello(channel, fingerprint)
        channel.close()
        assert isinstance(result, grpc.RpcError)
        assert result.code() == grpc.StatusCode.UNAVAILABLE
        # a holder of a valid run certificate still gets in: the peer is alive and serving
        good = grpc.ssl_channel_credentials(
            ca, (certs / "peer-1.key").read_bytes(), (certs / "peer-1.crt").read_bytes()
        )
        with grpc.secure_channel(address, good) as channel:
            assert _hello(channel, fingerprint) is True
        peers.procs[0].send_signal(signal.SIGTERM)
        assert peers.wait(timeout=60) == {0: 0}
    finally:
        peers.kill_all()


def test_a_valid_certificate_of_another_peer_cannot_impersonate(tmp_path: Path) -> None:
    """A client holding peer 0's own valid certificate claims to be peer 1: its Hello and its
    frames are refused (PERMISSION_DENIED, counted as "identity"), the peer keeps running."""
    config = _tls_config(tmp_path, epochs=500, startup=1.0)
    cfg = load_config(config, environ={})
    flat = FlatParams(build_model("mlp", 1, input_shape=(40,), num_classes=10, hidden=[8]))
    address = cfg.network.addresses[0]  # type: ignore[index]
    certs = tmp_path / "certs"
    peers = Peers(config, tmp_path, [0])
    try:
        metrics = tmp_path / "peer-0" / "metrics.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (metrics.is_file() and metrics.stat().st_size):
            time.sleep(0.1)
        stolen = grpc.ssl_channel_credentials(
            (certs / "ca.crt").read_bytes(),
            (certs / "peer-0.key").read_bytes(),
            (certs / "peer-0.crt").read_bytes(),
        )
        with grpc.secure_channel(address, stolen) as channel:
            result = _hello(channel, flat.fingerprint())  # claims peer 1
            assert isinstance(result, grpc.RpcError)
            assert result.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "certificate names peer 0" in (result.details() or "")
            frames = serde.frames(
                run_id="itest",
                sender=1,
                step=0,
                round=0,
                tensor_id=0,
                codec="none",
                dim=flat.d,
                parts={"values": torch.zeros(flat.d)},
                chunk_bytes=1 << 20,
            )
            raw = channel.stream_stream(
                "/concord.v1.Gossip/ExchangeRaw", response_deserializer=pb.Ack.FromString
            )
            with pytest.raises(grpc.RpcError) as info:
                list(raw(iter([serde.raw_message(f.header, f.body) for f in frames]), timeout=10))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
            assert "certificate names peer 0" in info.value.details()  # type: ignore[attr-defined]
        peers.procs[0].send_signal(signal.SIGTERM)
        assert peers.wait(timeout=60) == {0: 0}
        summary = json.loads((tmp_path / "peer-0" / "summary.json").read_text())
        assert summary["frames_rejected"].get("identity") == 2
    finally:
        peers.kill_all()
