"""The committed generated modules are exactly what ``scripts/gen-protos`` makes of
protos/*.proto."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("data_plane_pb2.py", "data_plane_pb2.pyi", "data_plane_pb2_grpc.py")


def test_generated_protos_are_fresh(tmp_path: Path) -> None:
    env = {**os.environ, "CONCORD_VENV": str(Path(sys.executable).parents[1])}
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen-protos"), str(tmp_path)],
        check=True,
        capture_output=True,
        env=env,
    )
    for name in GENERATED:
        fresh = (tmp_path / name).read_bytes()
        committed = (ROOT / "protos" / name).read_bytes()
        assert fresh == committed, f"protos/{name} is stale: run scripts/gen-protos"


def test_generated_code_imports_under_the_namespace() -> None:
    """The gRPC module imports its message module as ``concord.protos.data_plane_pb2``."""
    grpc_module = (ROOT / "protos" / "data_plane_pb2_grpc.py").read_text()
    assert "from concord.protos import data_plane_pb2" in grpc_module
    from concord.protos import data_plane_pb2 as pb

    assert pb.DESCRIPTOR.name == "concord/protos/data_plane.proto"


def test_every_proto_enum_value_is_implemented() -> None:
    from concord.core.config import CODEC_NAMES
    from concord.peer.serde import CODEC_TO_WIRE, DTYPE_TO_WIRE
    from concord.protos import data_plane_pb2 as pb

    codecs = {v.name for v in pb.Codec.DESCRIPTOR.values if v.number != 0}
    # every built-in codec, and CODEC_PLUGIN for the run's "module:Class" codec
    assert codecs == {f"CODEC_{n.upper()}" for n in CODEC_NAMES} | {"CODEC_PLUGIN"}
    assert set(CODEC_TO_WIRE) == set(CODEC_NAMES)
    dtypes = {v.number for v in pb.DType.DESCRIPTOR.values if v.number != 0}
    assert dtypes == set(DTYPE_TO_WIRE.values())
