"""What an emulated network looks like: typed, validated link parameters, the named profiles, and
the ``[network.emulation]`` table that selects and adjusts them.

Every host of an emulated network has one *access link* to a switch (its "last mile"); a packet
from host A to host B crosses A's link upwards and B's link downwards. So the values here are per
access link and per direction, and what two peers see is the sum of their two links: with
``delay_ms = 15`` on every link, the round trip between two peers is 4 × 15 = 60 ms.

Table shape (all keys optional; every value checked, all problems reported at once, each under its
dotted key with the allowed range)::

    [network.emulation]
    profile = "edge"          # a named profile as the starting point (`PROFILES`)
    delay_ms = 15             # one-way delay of every link, each direction
    jitter_ms = 0             # std. deviation of a normal law, clipped at ±3σ and at 0 ms
    loss = 0.0005             # mean loss probability per packet and link direction
    loss_burst = 1            # mean burst length in packets: 1 Bernoulli, > 1 Gilbert–Elliott
    rate_mbit = 20            # tbf cap of each direction; 0: no cap
    delay_spread_ms = [5, 37.5]  # peer i of n: delay lo + (hi - lo) * i / (n - 1), both ways
    mtu = 9000                # of every emulated interface
    reorder = false           # true: jitter may reorder the packets of one flow
    seed = 0                  # of the emulator's random draws
    [network.emulation.up]    # one direction only: the hosts' upload (same keys as above)
    rate_mbit = 5
    [network.emulation.peers.3]   # peer 3's link (same keys, and its own up / down tables)
    delay_ms = 60

A key given in the table replaces the profile's value for both directions (also the profile's
``up`` / ``down`` value of that key); a peer's keys replace the resolved values for that peer.

This module is pure (it reads a file only in `emulation_table`) and torch-free: the run config
(`concord.core.config_deploy.NetworkConfig.emulation`) validates the same table, and
`concord.lab.net` builds the emulated network from it.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from concord.core.suggest import closest
from concord.errors import ConfigError

Problems = list[tuple[str, str]]

LINK_KEYS = ("delay_ms", "jitter_ms", "loss", "loss_burst", "rate_mbit")
"""The keys of one link direction (`LinkSpec`'s fields)."""
RANGES: dict[str, tuple[float, float]] = {
    "delay_ms": (0.0, 10_000.0),
    "jitter_ms": (0.0, 1_000.0),
    "loss": (0.0, 0.5),
    "loss_burst": (1.0, 1_000.0),
    "rate_mbit": (0.1, 100_000.0),  # or 0: no cap
    "mtu": (1280, 65_000),
}
"""Allowed closed ranges of the numeric keys."""
DIRECTIONS = ("up", "down")


def _range_text(key: str) -> str:
    lo, hi = RANGES[key]
    text = f"{lo:g} ≤ {key} ≤ {hi:g}"
    return f"{key} = 0 (no cap) or {text}" if key == "rate_mbit" else text


def _number_problem(key: str, value: Any) -> str | None:
    """Why ``value`` is not a valid ``key`` (a number in its `RANGES`), or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number ({_range_text(key)}); got {value!r}"
    lo, hi = RANGES[key]
    if key == "rate_mbit" and value == 0:
        return None
    if not math.isfinite(value) or not lo <= value <= hi:
        return f"{value!r} is out of range: allowed {_range_text(key)}"
    return None


@dataclass(frozen=True)
class LinkSpec:
    """One direction of a host's access link. ``delay_ms``: one-way delay; ``jitter_ms``: the
    standard deviation of a normal law added to it (clipped at ±3σ and at a delay of 0);
    ``loss``: mean probability that a packet is dropped; ``loss_burst``: mean length of a run of
    lost packets (1: independent Bernoulli losses, > 1: a two-state Gilbert–Elliott chain);
    ``rate_mbit``: a tbf cap in Mbit/s of whole frames (0: none). Raises `ConfigError` naming
    each bad field and its allowed range."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    loss_burst: float = 1.0
    rate_mbit: float = 0.0

    def __post_init__(self) -> None:
        problems = [(k, p) for k in LINK_KEYS if (p := _number_problem(k, getattr(self, k)))]
        if problems:
            raise ConfigError(problems)

    @property
    def emulated(self) -> bool:
        """Whether the link emulator has anything to do on this direction (delay, jitter or
        loss; a rate alone is tbf's)."""
        return bool(self.delay_ms or self.jitter_ms or self.loss)


@dataclass(frozen=True)
class HostLink:
    """A host's access link: ``up`` carries what it sends, ``down`` what it receives."""

    up: LinkSpec = field(default_factory=LinkSpec)
    down: LinkSpec = field(default_factory=LinkSpec)

    @classmethod
    def both(cls, **values: float) -> HostLink:
        """The same `LinkSpec` (``values``) in both directions."""
        spec = LinkSpec(**values)
        return cls(spec, spec)

    @property
    def emulated(self) -> bool:
        """Whether either direction needs the link emulator."""
        return self.up.emulated or self.down.emulated


def _apply(link: HostLink, values: Mapping[str, Any]) -> HostLink:
    """``link`` with ``values`` applied: plain keys to both directions, then ``up`` / ``down``
    sub-tables to one (``values`` already validated)."""
    plain = {k: v for k, v in values.items() if k in LINK_KEYS}
    up = dataclasses.replace(link.up, **{**plain, **values.get("up", {})})
    down = dataclasses.replace(link.down, **{**plain, **values.get("down", {})})
    return HostLink(up, down)


@dataclass(frozen=True)
class Emulation:
    """An emulated network: every host's access link is ``link``, except that peer ``i`` of a
    run of ``n`` gets its delay from ``delay_spread_ms`` (when set) and then the keys of
    ``peers[i]`` (a validated table of `LINK_KEYS` and ``up`` / ``down`` sub-tables). ``mtu``
    of every emulated interface; ``reorder``: whether jitter may reorder a flow's packets;
    ``seed`` of the emulator's draws; ``profile``: the named profile it started from."""

    link: HostLink = field(default_factory=HostLink)
    peers: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    delay_spread_ms: tuple[float, float] | None = None
    mtu: int = 9000
    reorder: bool = False
    seed: int = 0
    profile: str | None = None

    def for_peer(self, peer: int, n_peers: int) -> HostLink:
        """Peer ``peer``'s link in a run of ``n_peers`` peers."""
        link = self.link
        if self.delay_spread_ms is not None:
            lo, hi = self.delay_spread_ms
            delay = lo + (hi - lo) * peer / (n_peers - 1) if n_peers > 1 else lo
            link = _apply(link, {"delay_ms": delay})
        return _apply(link, self.peers.get(peer, {}))

    def links(self, n_peers: int, where: str = "network.emulation") -> list[HostLink]:
        """Every peer's link for a run of ``n_peers``; `ConfigError` when an override names a
        peer the run does not have."""
        extra = sorted(p for p in self.peers if p >= n_peers)
        if extra:
            why = f"no such peer: the run has {n_peers} (0–{n_peers - 1})"
            raise ConfigError([(f"{where}.peers.{p}", why) for p in extra])
        return [self.for_peer(i, n_peers) for i in range(n_peers)]


PROFILES: dict[str, dict[str, Any]] = {
    "lan": {"rate_mbit": 1000.0},
    "wan": {"delay_ms": 10.0, "jitter_ms": 1.0, "loss": 0.0001, "rate_mbit": 100.0},
    "edge": {"delay_ms": 15.0, "loss": 0.0005, "rate_mbit": 20.0},
    "edge-mixed": {
        "delay_ms": 15.0,
        "loss": 0.0005,
        "rate_mbit": 20.0,
        "delay_spread_ms": [5.0, 37.5],
    },
    "edge-4g": {
        "delay_ms": 20.0,
        "jitter_ms": 4.0,
        "loss": 0.0025,
        "loss_burst": 2.0,
        "up": {"rate_mbit": 10.0},
        "down": {"rate_mbit": 40.0},
    },
    "edge-satellite": {
        "delay_ms": 150.0,
        "jitter_ms": 3.0,
        "loss": 0.0025,
        "up": {"rate_mbit": 5.0},
        "down": {"rate_mbit": 50.0},
    },
}
"""The named profiles, as ``[network.emulation]`` tables (per access link; peer to peer: the
sum of two links): ``lan`` 1 Gbit/s, nothing else; ``wan`` 100 Mbit/s, 40 ms RTT, 1 ms jitter,
0.01 %; ``edge`` 20 Mbit/s, 60 ms RTT, ≈ 0.1 % loss each way; ``edge-mixed`` edge with pairwise
RTTs from 20 to 150 ms; ``edge-4g`` 10 Mbit/s up / 40 down, 80 ms RTT, 4 ms jitter, ≈ 0.5 % loss
in bursts of 2; ``edge-satellite`` (geostationary) 5 Mbit/s up / 50 down, 600 ms RTT, ≈ 0.5 %."""

_TOP_KEYS = (
    *LINK_KEYS,
    "profile",
    "up",
    "down",
    "peers",
    "delay_spread_ms",
    "mtu",
    "reorder",
    "seed",
)
_PEER_KEYS = (*LINK_KEYS, "up", "down")


def _unknown(key: str, allowed: Sequence[str]) -> str:
    hint = closest(key, allowed)
    did = f" (did you mean {hint!r}?)" if hint else ""
    return f"unknown key{did}: allowed {', '.join(allowed)}"


def _check_links(table: Mapping[str, Any], where: str, allowed: Sequence[str]) -> Problems:
    """Problems of a table of `LINK_KEYS` with optional ``up`` / ``down`` sub-tables (plus
    whatever else ``allowed`` names, checked by the caller)."""
    problems: Problems = []
    for key, value in table.items():
        if key not in allowed:
            problems.append((f"{where}.{key}", _unknown(key, allowed)))
        elif key in LINK_KEYS and (p := _number_problem(key, value)):
            problems.append((f"{where}.{key}", p))
        elif key in DIRECTIONS:
            if not isinstance(value, Mapping):
                problems.append((f"{where}.{key}", f"must be a table of {', '.join(LINK_KEYS)}"))
            else:
                problems += _check_links(value, f"{where}.{key}", LINK_KEYS)
    return problems


def _check_top(table: Mapping[str, Any], where: str) -> Problems:
    """Problems of the keys only the top level has (besides the link keys)."""
    problems = _check_links(table, where, _TOP_KEYS)
    spread = table.get("delay_spread_ms")
    if spread is not None:
        lo_hi = RANGES["delay_ms"]
        ok = (
            isinstance(spread, list | tuple)
            and len(spread) == 2
            and all(_number_problem("delay_ms", v) is None for v in spread)
            and spread[0] <= spread[1]
        )
        if not ok:
            problems.append(
                (
                    f"{where}.delay_spread_ms",
                    f"must be [lo, hi] with {lo_hi[0]:g} ≤ lo ≤ hi ≤ {lo_hi[1]:g}; got {spread!r}",
                )
            )
    mtu = table.get("mtu")
    if mtu is not None and (
        isinstance(mtu, bool) or not isinstance(mtu, int) or _number_problem("mtu", mtu)
    ):
        problems.append((f"{where}.mtu", f"must be an integer, {_range_text('mtu')}; got {mtu!r}"))
    if "reorder" in table and not isinstance(table["reorder"], bool):
        problems.append((f"{where}.reorder", f"must be true or false; got {table['reorder']!r}"))
    seed = table.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        problems.append((f"{where}.seed", f"must be an integer ≥ 0; got {seed!r}"))
    return problems


def _check_peers(peers: Any, where: str) -> tuple[Problems, dict[int, Mapping[str, Any]]]:
    if not isinstance(peers, Mapping):
        return [(where, "must be a table of peer tables ([…peers.<index>])")], {}
    problems: Problems = []
    found: dict[int, Mapping[str, Any]] = {}
    for key, value in peers.items():
        here = f"{where}.{key}"
        if not str(key).isdigit():
            problems.append((here, "peer keys are peer indices (integers ≥ 0)"))
        elif not isinstance(value, Mapping):
            problems.append((here, f"must be a table of {', '.join(_PEER_KEYS)}"))
        else:
            problems += _check_links(value, here, _PEER_KEYS)
            found[int(key)] = value
    return problems, found


def _overlay(base: Mapping[str, Any], table: Mapping[str, Any]) -> dict[str, Any]:
    """``table`` over the profile ``base``: a link key of ``table`` also clears that key in the
    profile's ``up`` / ``down`` tables (see the module docstring)."""
    out = {k: v for k, v in base.items() if k not in DIRECTIONS}
    for d in DIRECTIONS:
        kept = {k: v for k, v in base.get(d, {}).items() if k not in table}
        out[d] = {**kept, **table.get(d, {})}
    out.update({k: v for k, v in table.items() if k not in DIRECTIONS})
    return out


def parse_emulation(
    table: Mapping[str, Any], where: str = "network.emulation", *, source: str | None = None
) -> Emulation:
    """The `Emulation` a ``[network.emulation]`` table describes (shape: module docstring).
    ``where``: the table's dotted key, prefixed to every problem; ``source``: the file it came
    from, if any. Raises `ConfigError` with every problem (key, what is wrong, allowed range)."""
    if not isinstance(table, Mapping):
        raise ConfigError([(where, "must be a table")], source)
    problems = _check_top(table, where)
    base: Mapping[str, Any] = {}
    name = table.get("profile")
    if name is not None:
        if name in PROFILES:
            base = PROFILES[name]
        else:
            hint = closest(str(name), list(PROFILES))
            did = f" (did you mean {hint!r}?)" if hint else ""
            why = f"unknown profile {name!r}{did}: one of {', '.join(PROFILES)}"
            problems.append((f"{where}.profile", why))
    peer_problems, peers = _check_peers(table.get("peers", {}), f"{where}.peers")
    problems += peer_problems
    if problems:
        raise ConfigError(problems, source)
    merged = _overlay(base, table)
    spread = merged.get("delay_spread_ms")
    return Emulation(
        link=_apply(HostLink(), merged),
        peers=peers,
        delay_spread_ms=(float(spread[0]), float(spread[1])) if spread is not None else None,
        mtu=int(merged.get("mtu", 9000)),
        reorder=bool(merged.get("reorder", False)),
        seed=int(merged.get("seed", 0)),
        profile=name,
    )


def profile(name: str) -> Emulation:
    """The named profile ``name`` (`PROFILES`); `ConfigError` naming the valid ones if unknown."""
    return parse_emulation({"profile": name})


def emulation_table(path: str | Path) -> dict[str, Any]:
    """The raw ``[network.emulation]`` table of the TOML file ``path`` (unchecked);
    `ConfigError` when the file cannot be read or has no such table."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError([("network.emulation", f"cannot read {path}: {e}")], str(path)) from e
    network = doc.get("network")
    table = network.get("emulation") if isinstance(network, dict) else None
    if table is None:
        raise ConfigError([("network.emulation", "missing: the file has no such table")], str(path))
    if not isinstance(table, dict):
        raise ConfigError([("network.emulation", "must be a table")], str(path))
    return table


def load_emulation(path: str | Path) -> Emulation:
    """The `Emulation` of the ``[network.emulation]`` table of the TOML file ``path``."""
    return parse_emulation(emulation_table(path), source=str(path))


def spec_table(spec: str) -> dict[str, Any]:
    """The ``[network.emulation]`` table ``spec`` stands for (what ``--net PROFILE|FILE``
    accepts): ``{"profile": spec}`` for a profile name, else the table of the TOML file
    ``spec``. Unchecked: `parse_emulation` checks it (`ConfigError` for an unknown profile)."""
    if spec in PROFILES or not Path(spec).exists():
        if spec not in PROFILES and ("/" in spec or spec.endswith(".toml")):
            raise ConfigError([("network.emulation", f"no such file: {spec}")], spec)
        return {"profile": spec}
    return emulation_table(spec)


def resolve(spec: str) -> Emulation:
    """The `Emulation` ``spec`` (a profile name or a TOML file, `spec_table`) describes."""
    source = None if spec in PROFILES or not Path(spec).exists() else spec
    return parse_emulation(spec_table(spec), source=source)


def problems_text(exc: ConfigError, where: str = "network.emulation") -> str:
    """``exc``'s problems in one line, each key relative to ``where`` (for a config validator
    whose error already names ``where``)."""
    return "; ".join(
        f"{key.removeprefix(where).removeprefix('.') or where}: {why}" for key, why in exc.problems
    )
