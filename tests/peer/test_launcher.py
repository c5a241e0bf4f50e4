"""`concord.peer.launcher`: a peer's id and GPU index from the launcher's environment, in the
documented order, with an error naming any value it cannot read."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from concord.peer.launcher import ID_VARIABLES, LauncherError, resolve_identity


def test_an_explicit_id_wins_over_every_launcher_variable() -> None:
    env = dict.fromkeys(ID_VARIABLES, "3")
    got = resolve_identity(5, env, "peer-7", peers=8)
    assert (got.peer_id, got.source) == (5, "--id")


@pytest.mark.parametrize("k", range(len(ID_VARIABLES)))
def test_the_first_variable_set_in_the_documented_order_names_the_peer(k: int) -> None:
    # every variable after the k-th is set too, to other ids: only the k-th may be read
    env = {name: str(j) for j, name in enumerate(ID_VARIABLES) if j >= k}
    got = resolve_identity(None, env, "login-node", peers=8)
    assert (got.peer_id, got.source) == (k, ID_VARIABLES[k])


def test_a_statefulset_hostname_gives_its_ordinal() -> None:
    got = resolve_identity(None, {}, "concord-peer-12.peers.default.svc", peers=16)
    assert (got.peer_id, got.source) == (12, "hostname concord-peer-12.peers.default.svc")


def test_an_empty_variable_is_not_set() -> None:
    got = resolve_identity(None, {"CONCORD_PEER_ID": "", "RANK": "2"}, "x", peers=4)
    assert (got.peer_id, got.source) == (2, "RANK")


@pytest.mark.parametrize(
    ("env", "hostname", "words"),
    [
        ({}, "laptop", "no peer id: pass --id"),
        ({"RANK": "one"}, "peer-1", "RANK='one' is not a non-negative integer"),
        ({"SLURM_PROCID": "-1"}, "peer-1", "SLURM_PROCID='-1'"),
        ({"JOB_COMPLETION_INDEX": "9"}, "x", "peer id 9 (from JOB_COMPLETION_INDEX) is not below"),
        ({}, "peer-012", "no peer id"),  # not an ordinal a StatefulSet writes
    ],
)
def test_unusable_launcher_input_is_an_error_naming_it(
    env: dict[str, str], hostname: str, words: str
) -> None:
    with pytest.raises(LauncherError, match=words.replace("(", r"\(").replace(")", r"\)")):
        resolve_identity(None, env, hostname, peers=8)


def test_the_local_device_index_comes_from_local_rank_then_slurm_localid() -> None:
    got = resolve_identity(None, {"RANK": "5", "LOCAL_RANK": "1", "SLURM_LOCALID": "0"}, "x", 8)
    assert (got.local_index, got.local_source) == (1, "LOCAL_RANK")
    got = resolve_identity(3, {"SLURM_LOCALID": "2"}, "x", 8)
    assert (got.local_index, got.local_source) == (2, "SLURM_LOCALID")
    assert resolve_identity(3, {}, "x", 8).local_index is None
    with pytest.raises(LauncherError, match="LOCAL_RANK='gpu0'"):
        resolve_identity(3, {"LOCAL_RANK": "gpu0"}, "x", 8)


def test_concord_peer_without_an_id_says_what_it_read(tmp_path: Path) -> None:
    from concord.lab.cli import main

    config = tmp_path / "run.toml"
    config.write_text('peers = 4\n[network]\naddresses = ["a:1", "a:2", "a:3", "a:4"]\n')
    env = dict.fromkeys(ID_VARIABLES) | {"SLURM_PROCID": "4"}
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["peer", "--config", str(config), "--out", str(out)], env=env)
    assert r.exit_code == 2
    assert "peer id 4 (from SLURM_PROCID) is not below the config's peers = 4" in r.output
    assert not out.exists()  # refused before anything was written
