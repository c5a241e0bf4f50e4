"""The committed generated modules are exactly what grpcio-tools makes of protos/*.proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("data_plane_pb2.py", "data_plane_pb2.pyi", "data_plane_pb2_grpc.py")


def test_generated_protos_are_fresh(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            ".",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            "protos/data_plane.proto",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    for name in GENERATED:
        fresh = (tmp_path / "protos" / name).read_bytes()
        committed = (ROOT / "protos" / name).read_bytes()
        assert fresh == committed, f"protos/{name} is stale: run scripts/gen-protos"


def test_every_proto_enum_value_is_implemented() -> None:
    from core.config import CODEC_NAMES
    from peer.serde import CODEC_TO_WIRE, DTYPE_TO_WIRE
    from protos import data_plane_pb2 as pb

    codecs = {v.name for v in pb.Codec.DESCRIPTOR.values if v.number != 0}
    assert codecs == {f"CODEC_{n.upper()}" for n in CODEC_NAMES}
    assert set(CODEC_TO_WIRE) == set(CODEC_NAMES)
    dtypes = {v.number for v in pb.DType.DESCRIPTOR.values if v.number != 0}
    assert dtypes == set(DTYPE_TO_WIRE.values())
