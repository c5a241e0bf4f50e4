"""Named link profiles and the ``[network.emulation]`` table (`concord.core.emulation`):
the profiles say what their docs say peer to peer, overrides land where the table puts them, and
every bad value is reported under its dotted key with the allowed range."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from concord.core.config import build_config, load_config, to_toml
from concord.core.emulation import (
    PROFILES,
    Emulation,
    HostLink,
    LinkSpec,
    load_emulation,
    parse_emulation,
    profile,
    resolve,
    spec_table,
)
from concord.errors import ConfigError


def rtt_ms(a: HostLink, b: HostLink) -> float:
    """Round trip between two hosts: a's up, b's down, b's up, a's down."""
    return a.up.delay_ms + b.down.delay_ms + b.up.delay_ms + a.down.delay_ms


def path_loss(a: HostLink, b: HostLink) -> float:
    return 1 - (1 - a.up.loss) * (1 - b.down.loss)


def test_every_named_profile_parses() -> None:
    assert set(PROFILES) >= {"lan", "wan", "edge", "edge-mixed", "edge-4g", "edge-satellite"}
    for name in PROFILES:
        emulation = profile(name)
        assert emulation.profile == name
        assert emulation.mtu == 9000


def test_edge_is_20_mbit_60_ms_rtt_and_a_tenth_of_a_percent_peer_to_peer() -> None:
    link = profile("edge").link
    assert rtt_ms(link, link) == 60.0
    assert link.up.rate_mbit == link.down.rate_mbit == 20.0
    assert path_loss(link, link) == pytest.approx(0.001, rel=0.01)
    assert profile("lan").link.emulated is False  # a rate only: no emulator needed


def test_edge_mixed_spreads_pairwise_rtts_from_20_to_150_ms() -> None:
    links = profile("edge-mixed").links(8)
    rtts = [rtt_ms(a, b) for a, b in itertools.combinations_with_replacement(links, 2)]
    assert min(rtts) == pytest.approx(20.0)
    assert max(rtts) == pytest.approx(150.0)
    assert len({link.up.delay_ms for link in links}) == 8
    assert all(link.up.rate_mbit == 20.0 for link in links)  # the rest is edge's


def test_asymmetric_profiles_rate_each_direction() -> None:
    g4 = profile("edge-4g").link
    assert (g4.up.rate_mbit, g4.down.rate_mbit) == (10.0, 40.0)
    assert g4.up.loss_burst == 2.0
    sat = profile("edge-satellite").link
    assert rtt_ms(sat, sat) == 600.0


def test_table_keys_override_the_profile_for_both_directions() -> None:
    e = parse_emulation({"profile": "edge-4g", "rate_mbit": 25, "up": {"delay_ms": 30}})
    assert (e.link.up.rate_mbit, e.link.down.rate_mbit) == (25, 25)  # clears 4g's up/down rates
    assert (e.link.up.delay_ms, e.link.down.delay_ms) == (30, 20)
    assert e.link.up.jitter_ms == 4.0  # untouched keys stay the profile's


def test_peer_overrides_mix_links_in_one_run() -> None:
    table = {
        "profile": "edge",
        "peers": {"3": {"delay_ms": 60, "down": {"rate_mbit": 5}}, "5": {"loss": 0.01}},
        "mtu": 1500,
        "reorder": True,
        "seed": 9,
    }
    e = parse_emulation(table)
    links = e.links(8)
    assert links[0] == e.link
    assert (links[3].up.delay_ms, links[3].down.delay_ms) == (60, 60)
    assert (links[3].up.rate_mbit, links[3].down.rate_mbit) == (20, 5)
    assert links[5].up.loss == links[5].down.loss == 0.01
    assert (e.mtu, e.reorder, e.seed) == (1500, True, 9)
    with pytest.raises(ConfigError, match=r"network\.emulation\.peers\.5: no such peer"):
        e.links(4)


def test_a_peer_override_beats_the_spread() -> None:
    e = parse_emulation({"profile": "edge-mixed", "peers": {"0": {"delay_ms": 100}}})
    assert e.for_peer(0, 4).up.delay_ms == 100
    assert e.for_peer(3, 4).up.delay_ms == 37.5


def test_without_a_profile_nothing_is_emulated_but_what_is_given() -> None:
    e = parse_emulation({"delay_ms": 40})
    assert e.link == HostLink.both(delay_ms=40)
    assert e.profile is None
    assert parse_emulation({}).link.emulated is False


def _problems(table: object) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_emulation(table, "network.emulation", source="run.toml")  # type: ignore[arg-type]
    assert info.value.source == "run.toml"
    return dict(info.value.problems)


def test_bad_values_name_their_key_and_allowed_range_all_at_once() -> None:
    problems = _problems(
        {
            "loss": 0.7,
            "delay_ms": -1,
            "rate_mbit": 0.01,
            "jitter_ms": True,
            "up": {"loss_burst": 0.5},
            "mtu": 100,
            "seed": -1,
            "reorder": "yes",
            "delay_spread_ms": [50, 10],
        }
    )
    assert problems == {
        "network.emulation.loss": "0.7 is out of range: allowed 0 ≤ loss ≤ 0.5",
        "network.emulation.delay_ms": "-1 is out of range: allowed 0 ≤ delay_ms ≤ 10000",
        "network.emulation.rate_mbit": (
            "0.01 is out of range: allowed rate_mbit = 0 (no cap) or 0.1 ≤ rate_mbit ≤ 100000"
        ),
        "network.emulation.jitter_ms": "must be a number (0 ≤ jitter_ms ≤ 1000); got True",
        "network.emulation.up.loss_burst": ("0.5 is out of range: allowed 1 ≤ loss_burst ≤ 1000"),
        "network.emulation.mtu": "must be an integer, 1280 ≤ mtu ≤ 65000; got 100",
        "network.emulation.seed": "must be an integer ≥ 0; got -1",
        "network.emulation.reorder": "must be true or false; got 'yes'",
        "network.emulation.delay_spread_ms": (
            "must be [lo, hi] with 0 ≤ lo ≤ hi ≤ 10000; got [50, 10]"
        ),
    }


def test_unknown_names_are_refused_with_a_suggestion() -> None:
    problems = _problems({"profile": "edgee", "dealy_ms": 3, "peers": {"x": {}, "2": {"los": 1}}})
    assert "unknown profile 'edgee' (did you mean 'edge'?)" in problems["network.emulation.profile"]
    assert "edge-satellite" in problems["network.emulation.profile"]  # lists the valid ones
    assert "did you mean 'delay_ms'?" in problems["network.emulation.dealy_ms"]
    assert "peer indices" in problems["network.emulation.peers.x"]
    assert "did you mean 'loss'?" in problems["network.emulation.peers.2.los"]
    assert "must be a table" in _problems({"up": 3})["network.emulation.up"]
    assert "must be a table" in _problems(["edge"])["network.emulation"]


def test_link_specs_validate_themselves() -> None:
    with pytest.raises(ConfigError) as info:
        LinkSpec(loss=2.0, delay_ms=float("nan"))
    assert [key for key, _ in info.value.problems] == ["delay_ms", "loss"]
    assert LinkSpec(delay_ms=1).emulated
    assert not LinkSpec(rate_mbit=10).emulated


def test_a_toml_file_holds_the_table(tmp_path: Path) -> None:
    path = tmp_path / "net.toml"
    path.write_text('[network.emulation]\nprofile = "edge"\n[network.emulation.peers.1]\n'
                    "delay_ms = 50\n")  # fmt: skip
    e = load_emulation(path)
    assert e.for_peer(1, 2).up.delay_ms == 50
    assert resolve(str(path)) == e
    assert resolve("wan") == profile("wan")
    assert isinstance(resolve("lan"), Emulation)
    path.write_text("[network]\n")
    with pytest.raises(ConfigError, match="no such table"):
        load_emulation(path)
    path.write_text("[network.emulation]\nloss = 1\n")
    with pytest.raises(ConfigError, match=r"network\.emulation\.loss") as info:
        resolve(str(path))
    assert info.value.source == str(path)
    with pytest.raises(ConfigError, match="no such file"):
        resolve(str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="unknown profile"):
        resolve("satellite")


def test_the_run_config_records_the_table_and_reads_it_back(tmp_path: Path) -> None:
    """``[network.emulation]`` of a run config: validated with the rest, written to the run's
    config.toml by `to_toml` and read back into the same links."""
    table = {"profile": "edge", "up": {"rate_mbit": 5.0}, "peers": {"1": {"delay_ms": 40.0}}}
    cfg = build_config({"network": {"emulation": table}})
    path = tmp_path / "config.toml"
    path.write_text(to_toml(cfg), encoding="utf-8")
    again = load_config(path)
    assert again.network.emulation == table
    emulation = again.network.link_emulation()
    assert emulation == parse_emulation(table)
    assert emulation is not None
    assert emulation.for_peer(1, 2).down.delay_ms == 40.0
    assert emulation.link.up.rate_mbit == 5.0
    assert emulation.link.down.rate_mbit == 20.0
    assert build_config({}).network.link_emulation() is None
    assert spec_table("edge") == {"profile": "edge"}


def test_bad_run_config_tables_name_the_key_and_the_allowed_range() -> None:
    with pytest.raises(ConfigError) as info:
        build_config({"network": {"emulation": {"loss": 0.9, "peers": {"2": {"rate_mbit": -1}}}}})
    (key, why), *_ = info.value.problems
    assert key == "network.emulation"
    assert "loss: 0.9 is out of range: allowed 0 ≤ loss ≤ 0.5" in why
    assert "peers.2.rate_mbit" in why
    assert "rate_mbit = 0 (no cap)" in why
    with pytest.raises(ConfigError, match=r"network\.emulation.*unknown profile 'edg'.*'edge'"):
        build_config({}, {"network.emulation": {"profile": "edg"}})
