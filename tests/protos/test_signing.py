"""Signed control messages (`concord.protos.signing`) without a broker: every check of the
verifier refuses what it must with a specific reason, Last-Wills are judged apart from ordinary
messages, the run config builds the right signer and verifier, and the cost per message."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import msgpack
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given
from hypothesis import strategies as st

from concord.core.config import load_config
from concord.errors import CertError, ConfigError, PayloadError
from concord.peer.certs import init_ca, issue_orchestrator, issue_peer
from concord.protos.control_plane import (
    SCHEMA_VERSION,
    TOPICS,
    Heartbeat,
    Schedule,
    Status,
    Topics,
    decode,
    encode,
)
from concord.protos.signing import (
    CONTEXT,
    SignatureError,
    Signer,
    Verifier,
    _der,
    _load_cert,
    _load_key,
    required_identity,
    signing_for,
)
from tests.fuzz.targets import fuzz_settings

RUN = "signed-run"
TOPICS_ = Topics(RUN)
BEAT = encode(Heartbeat(peer=1, step=3, ts=1.0))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    init_ca(d, run_id=RUN)
    for i in range(3):
        issue_peer(d, i)
    issue_orchestrator(d)
    other = d / "other"
    init_ca(other, run_id=RUN)  # another CA, same run id
    issue_peer(other, 1)
    return d


def signer(pki: Path, who: str, *, run: str = RUN, epoch: int | None = None) -> Signer:
    s = Signer.load(who, pki / f"{who}.key", pki / f"{who}.crt", run)
    if epoch is not None:
        s.epoch = epoch
    return s


def verifier(pki: Path) -> Verifier:
    return Verifier.load(pki / "ca.crt", RUN)


def refused(v: Verifier, topic: str, payload: bytes, reason: str, text: str) -> SignatureError:
    with pytest.raises(SignatureError) as info:
        v.open(topic, payload)
    assert info.value.reason == reason, info.value.problem
    assert text in info.value.problem
    assert info.value.topic == topic
    return info.value


def forge(key: ec.EllipticCurvePrivateKey, cert_der: bytes, **fields: Any) -> bytes:
    """An envelope signed with ``key`` over whatever ``fields`` say."""
    env: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "kind": "signed",
        "run": RUN,
        "from": "peer-1",
        "epoch": 1,
        "seq": 1,
        "conn": 0,
        "will": False,
        "topic": TOPICS_.topic("heartbeat", 1),
        "body": BEAT,
        "crt": cert_der,
    }
    env.update(fields)
    signed = msgpack.packb(
        [CONTEXT, env["run"], env["from"], env["epoch"], env["seq"], env["conn"], env["will"],
         env["topic"], env["body"]],
        use_bin_type=True,
    )  # fmt: skip
    env["sig"] = key.sign(signed, ec.ECDSA(hashes.SHA256()))
    return bytes(msgpack.packb(env, use_bin_type=True))


# ------------------------------------------------------------------------------------ accepted


def test_a_signed_message_round_trips_and_decodes(pki: Path) -> None:
    v, s = verifier(pki), signer(pki, "peer-1")
    topic = TOPICS_.topic("heartbeat", 1)
    body = v.open(topic, s.seal(topic, BEAT))
    assert body == BEAT
    assert decode(topic, body) == Heartbeat(peer=1, step=3, ts=1.0)
    o = signer(pki, "orchestrator")
    topic = TOPICS_.topic("schedule")
    schedule = encode(
        Schedule(version=1, peers=[0, 1], topology="ring", weights=None, kappa=1.0, seed=0,
                 phases=[])
    )  # fmt: skip
    assert v.open(topic, o.seal(topic, schedule)) == schedule
    assert v.accepted == 2


def test_required_identities_follow_the_topic_table() -> None:
    for kind, spec in TOPICS.items():
        if spec.per_peer:
            assert required_identity(TOPICS_.topic(kind, 7)) == "peer-7"
        else:
            assert required_identity(TOPICS_.topic(kind)) == "orchestrator"
    assert required_identity("concord/v1/r/stats") is None
    assert required_identity("concord/v1/r/schedule/3") is None
    assert required_identity("concord/v1/r/nope") is None
    assert required_identity("elsewhere/x") is None


# ------------------------------------------------------------------------------------- refused


def test_replays_and_earlier_incarnations_are_dropped(pki: Path) -> None:
    v = verifier(pki)
    topic = TOPICS_.topic("status", 1)
    status = encode(Status(peer=1, state="ready"))
    first = signer(pki, "peer-1", epoch=1_000)
    a, b = first.seal(topic, status), first.seal(topic, status)
    v.open(topic, b)
    refused(v, topic, b, "duplicate", "a second copy of the last accepted message")
    refused(v, topic, a, "replay", "(epoch 1000, seq 1; accepted up to epoch 1000, seq 2)")
    later = signer(pki, "peer-1", epoch=2_000)  # a restart: a new epoch, seq from 1 again
    v.open(topic, later.seal(topic, status))
    refused(v, topic, first.seal(topic, status), "replay", "an earlier incarnation's message")
    # the incarnation floor is per sender: on a topic where only the old one was heard, too
    beat = TOPICS_.topic("heartbeat", 1)
    refused(v, beat, first.seal(beat, BEAT), "replay", "(epoch 1000; peer-1 is at epoch 2000)")
    refused(v, topic, first.seal(topic, status, will=True), "replay", "earlier incarnation's Last")
    assert v.open(beat, later.seal(beat, BEAT)) == BEAT
    # sequence numbers are per topic: a later heartbeat does not make an older status stale
    other = signer(pki, "peer-1", epoch=3_000)
    s1, b2 = other.seal(topic, status), other.seal(beat, BEAT)
    assert v.open(beat, b2) == BEAT
    assert v.open(topic, s1) == status


def test_a_will_is_judged_against_earlier_wills_only(pki: Path) -> None:
    v = verifier(pki)
    topic = TOPICS_.topic("status", 2)
    offline = encode(Status(peer=2, state="offline"))
    ready = encode(Status(peer=2, state="ready"))
    s = signer(pki, "peer-2")
    will1 = s.seal(topic, offline, will=True)  # signed at connect: seq 1
    for _ in range(3):  # seq 2..4: published while connected
        v.open(topic, s.seal(topic, ready))
    assert v.open(topic, will1) == offline  # the broker publishes it later: still accepted
    refused(v, topic, will1, "duplicate", "a second copy")
    will2 = s.seal(topic, offline, will=True)  # the next connection's will
    v.open(topic, s.seal(topic, ready))
    assert v.open(topic, will2) == offline
    refused(v, topic, will1, "replay", "Last-Will")


def test_the_will_of_an_earlier_connection_is_stale_once_a_later_one_spoke(pki: Path) -> None:
    """Connection 1's will was never published (the connection closed cleanly); after
    connection 2's first message, anyone replaying that will (the broker kept it) is refused:
    every envelope carries the seq of its connection's will (``conn``)."""
    v = verifier(pki)
    topic = TOPICS_.topic("status", 2)
    offline = encode(Status(peer=2, state="offline"))
    ready = encode(Status(peer=2, state="ready"))
    s = signer(pki, "peer-2")
    will1 = s.seal(topic, offline, will=True)
    assert v.open(topic, s.seal(topic, ready)) == ready
    will2 = s.seal(topic, offline, will=True)
    assert msgpack.unpackb(will2)["conn"] == msgpack.unpackb(will2)["seq"]
    beat = TOPICS_.topic("heartbeat", 2)
    assert v.open(beat, s.seal(beat, encode(Heartbeat(peer=2, step=1, ts=1.0))))
    refused(v, topic, will1, "replay", "a stale Last-Will of an earlier connection")
    assert v.open(topic, will2) == offline  # the current connection's will stands


def test_an_unsigned_message_is_refused_on_a_run_with_a_pki(pki: Path) -> None:
    v = verifier(pki)
    topic = TOPICS_.topic("heartbeat", 1)
    refused(v, topic, BEAT, "unsigned", "unsigned message on a run with a PKI")


def test_a_signed_envelope_needs_a_verifier(pki: Path) -> None:
    topic = TOPICS_.topic("heartbeat", 1)
    with pytest.raises(PayloadError, match="a signed envelope, but this receiver has no run CA"):
        decode(topic, signer(pki, "peer-1").seal(topic, BEAT))


def test_another_run_another_topic_another_sender_are_refused(pki: Path) -> None:
    v = verifier(pki)
    beat1, beat2 = TOPICS_.topic("heartbeat", 1), TOPICS_.topic("heartbeat", 2)
    foreign = signer(pki, "peer-1", run="other-run")
    refused(v, beat1, foreign.seal(beat1, BEAT), "run", "signed for run 'other-run'")
    s = signer(pki, "peer-1")
    refused(v, beat2, s.seal(beat1, BEAT), "topic", f"signed for topic {beat1!r}")
    # peer 1's own key, its own name, on peer 2's topic
    e = refused(v, beat2, s.seal(beat2, BEAT), "identity", "only 'peer-2' may publish")
    assert e.sender == "peer-1"
    # a peer posing as the orchestrator
    decision = TOPICS_.topic("decision")
    refused(v, decision, s.seal(decision, BEAT), "identity", "only 'orchestrator' may publish")
    # claiming to be peer 2 with peer 1's certificate (and key)
    key, crt = _load_key(pki / "peer-1.key"), s.cert_der
    forged = forge(key, crt, **{"from": "peer-2", "topic": beat2})
    refused(v, beat2, forged, "identity", "claims 'peer-2', but its certificate is 'peer-1'")


def test_certificates_that_do_not_chain_to_the_run_ca_are_refused(pki: Path) -> None:
    v = verifier(pki)
    topic = TOPICS_.topic("heartbeat", 1)
    other = Signer.load("peer-1", pki / "other/peer-1.key", pki / "other/peer-1.crt", RUN)
    # the same subject names, another CA key: the chain does not verify
    refused(v, topic, other.seal(topic, BEAT), "certificate", "does not verify against the run CA")
    # the run CA's own (self-signed) certificate, signed with the CA key
    ca_key = _load_key(pki / "ca.key")
    forged = forge(ca_key, _der(_load_cert(pki / "ca.crt")))
    refused(v, topic, forged, "certificate", "is a CA certificate")
    refused(
        v, topic, forge(ca_key, b"\x30\x03junk"), "certificate", "is not a valid DER certificate"
    )


def test_a_tampered_message_and_an_expired_certificate_are_refused(pki: Path) -> None:
    v = verifier(pki)
    topic = TOPICS_.topic("heartbeat", 1)
    env = msgpack.unpackb(signer(pki, "peer-1").seal(topic, BEAT))
    env["body"] = encode(Heartbeat(peer=1, step=99, ts=1.0))
    refused(v, topic, msgpack.packb(env), "signature", "the signature does not verify")
    env = msgpack.unpackb(signer(pki, "peer-1").seal(topic, BEAT))
    env["seq"] += 1  # a later sequence number, to pass as new
    refused(v, topic, msgpack.packb(env), "signature", "does not verify")
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=400)
    with pytest.raises(SignatureError, match="not now") as info:
        v.open(topic, signer(pki, "peer-1").seal(topic, BEAT), now=later)
    assert info.value.reason == "expired"


@pytest.mark.parametrize(
    ("payload", "text"),
    [
        (b"\xc1", "not a msgpack map"),
        (msgpack.packb([1, 2]), "must be a msgpack map"),
        (msgpack.packb({"v": 9, "kind": "signed"}), "schema version 9"),
        (msgpack.packb({"v": SCHEMA_VERSION, "kind": "signed"}), "missing field(s) run, from"),
        (b"\x00" * (400 * 1024), "exceeds the limit"),
    ],
)
def test_malformed_envelopes_are_refused(pki: Path, payload: bytes, text: str) -> None:
    refused(verifier(pki), TOPICS_.topic("heartbeat", 1), payload, "malformed", text)


@pytest.mark.parametrize(
    ("change", "text"),
    [
        ({"x": 1}, "unknown field(s) x"),
        ({"seq": -1}, "'seq' must be an int"),
        ({"epoch": True}, "'epoch' must be an int"),
        ({"will": 1}, "'will' must be a bool"),
        ({"body": "text"}, "'body' must be a non-empty bytes"),
        ({"crt": b""}, "'crt' must be a non-empty bytes"),
        ({"from": 7}, "'from' must be a non-empty str"),
        ({"conn": 2}, "'conn' must be the seq of the sender's current Last-Will"),
        ({"will": True}, "'conn' must be the seq of the sender's current Last-Will"),
    ],
)
def test_envelope_fields_are_checked(pki: Path, change: dict[str, Any], text: str) -> None:
    topic = TOPICS_.topic("heartbeat", 1)
    env = msgpack.unpackb(signer(pki, "peer-1").seal(topic, BEAT))
    env.update(change)
    refused(verifier(pki), topic, msgpack.packb(env, use_bin_type=True), "malformed", text)


def test_a_signer_needs_its_own_certificate(pki: Path) -> None:
    with pytest.raises(CertError, match="CN is 'peer-1', not the identity 'peer-2'"):
        Signer.load("peer-2", pki / "peer-1.key", pki / "peer-1.crt", RUN)
    with pytest.raises(CertError, match="does not belong to the certificate"):
        Signer.load("peer-1", pki / "peer-2.key", pki / "peer-1.crt", RUN)
    with pytest.raises(CertError, match="cannot read the private key"):
        Signer.load("peer-1", pki / "none.key", pki / "peer-1.crt", RUN)


def test_verified_certificates_are_cached(pki: Path) -> None:
    v = verifier(pki)
    topic = TOPICS_.topic("heartbeat", 1)
    s = signer(pki, "peer-1")
    for _ in range(5):
        v.open(topic, s.seal(topic, BEAT))
    assert len(v._certs) == 1


# ---------------------------------------------------------------------------- from the config


def _cfg(pki: Path, *extra: str) -> Any:
    sets = [
        "peers=3",
        f"network.tls.ca={pki}/ca.crt",
        f"network.tls.cert={pki}/peer-{{id}}.crt",
        f"network.tls.key={pki}/peer-{{id}}.key",
        *extra,
    ]
    return load_config(None, sets, environ={})


def test_signing_from_the_run_config(pki: Path) -> None:
    cfg = _cfg(pki)
    peer = signing_for(cfg, "peer-2", RUN)
    orch = signing_for(cfg, "orchestrator", RUN)
    monitor = signing_for(cfg, "monitor", RUN)
    assert peer.signer is not None
    assert peer.signer.identity == "peer-2"
    assert orch.signer is not None
    assert orch.signer.identity == "orchestrator"
    assert monitor.signer is None
    assert monitor.verifier is not None
    topic = TOPICS_.topic("status", 2)
    status = encode(Status(peer=2, state="ready"))
    assert monitor.verifier.open(topic, peer.signer.seal(topic, status)) == status
    assert signing_for(_cfg(pki, "network.tls.sign_control=false"), "peer-2", RUN) == (None, None)
    assert signing_for(load_config(None, ["peers=3"], environ={}), "peer-2", RUN) == (None, None)


def test_signing_config_errors_name_the_key(pki: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    init_ca(bare, run_id=RUN)  # no orchestrator certificate
    cfg = load_config(
        None,
        ["peers=2", f"network.tls.ca={bare}/ca.crt", "network.tls.cert=c", "network.tls.key=k"],
        environ={},
    )
    with pytest.raises(ConfigError) as info:
        signing_for(cfg, "orchestrator", RUN)
    key, text = info.value.problems[0]
    assert key == "network.tls.orchestrator_cert"
    assert "orchestrator.key" in text
    assert "concord certs issue --orchestrator" in text
    # a peer certificate of another CA: refused before anything is sent
    cfg = _cfg(pki, f"network.tls.ca={pki}/other/ca.crt")
    with pytest.raises(ConfigError, match="does not verify against the run CA") as info:
        signing_for(cfg, "peer-0", RUN)
    assert info.value.problems[0][0] == "network.tls.cert"
    with pytest.raises(ConfigError, match="orchestrator_cert and orchestrator_key go together"):
        _cfg(pki, f"network.tls.orchestrator_cert={pki}/orchestrator.crt")


# ----------------------------------------------------------------------------------- the cost


def test_sealing_many_messages_gives_strictly_increasing_sequence_numbers(pki: Path) -> None:
    """Each envelope of one signer opens once, in order (their cost: ``bench/signing.py``)."""
    v, s = verifier(pki), signer(pki, "peer-1")
    topic = TOPICS_.topic("heartbeat", 1)
    sealed = [s.seal(topic, BEAT) for _ in range(50)]
    assert [v.open(topic, e) for e in sealed] == [BEAT] * 50
    seqs = [msgpack.unpackb(e)["seq"] for e in sealed]
    assert seqs == sorted(set(seqs))
    with pytest.raises(SignatureError):
        v.open(topic, sealed[-1])


# ------------------------------------------------------------------------------------ fuzzing


@fuzz_settings(max_examples=200)
@given(data=st.data())
def test_any_change_to_an_envelope_is_refused_never_a_crash(pki: Path, data: st.DataObject) -> None:
    """Flipped, inserted, deleted or truncated bytes, or a re-packed envelope with one field
    replaced: `open` returns the original body (only when the change left the signed content
    intact) or raises SignatureError — no other exception."""
    v = verifier(pki)
    s = signer(pki, "peer-1")
    topic = TOPICS_.topic("heartbeat", 1)
    envelope = bytearray(s.seal(topic, BEAT))
    how = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate", "field"]))
    if how == "field":
        env = msgpack.unpackb(bytes(envelope))
        name = data.draw(st.sampled_from(sorted(env)))
        env[name] = data.draw(
            st.one_of(st.none(), st.booleans(), INT64, st.binary(max_size=64),
                      st.text(max_size=32), st.lists(INT64, max_size=3))
        )  # fmt: skip
        mutated = msgpack.packb(env, use_bin_type=True)
    else:
        # a position independent of the envelope's length (signatures vary by a byte or two)
        at = data.draw(st.integers(0, 2**16)) % len(envelope)
        if how == "flip":
            envelope[at] ^= data.draw(st.integers(1, 255))
        elif how == "insert":
            envelope[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        elif how == "delete":
            del envelope[at]
        else:
            del envelope[at:]
        mutated = bytes(envelope)
    outcome: bytes | SignatureError
    try:
        outcome = v.open(topic, mutated)
    except SignatureError as exc:
        outcome = exc
    if isinstance(outcome, SignatureError):
        assert outcome.reason in REASONS
    else:  # only a change outside the signed content (e.g. an equivalent re-encoding)
        assert outcome == BEAT


INT64 = st.integers(-(2**63), 2**63 - 1)  # what msgpack can pack
REASONS = {
    "unsigned", "malformed", "run", "topic", "identity", "certificate", "expired", "signature",
    "replay", "duplicate",
}  # fmt: skip


def test_a_signature_is_good_only_while_the_run_ca_is_valid(tmp_path: Path) -> None:
    """A sender's certificate may outlive the run CA that issued it; its messages must not."""
    from concord.peer.certs import init_ca, issue_peer

    init_ca(tmp_path, run_id=RUN, days=2)
    issue_peer(tmp_path, 1, days=30)
    v = Verifier.load(tmp_path / "ca.crt", RUN)
    s = Signer.load("peer-1", tmp_path / "peer-1.key", tmp_path / "peer-1.crt", RUN)
    topic = TOPICS_.topic("heartbeat", 1)
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    assert v.open(topic, s.seal(topic, BEAT), now=soon) == BEAT
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=5)  # the CA expired, the leaf not
    with pytest.raises(SignatureError, match="with the run CA") as info:
        v.open(topic, s.seal(topic, BEAT), now=later)
    assert info.value.reason == "expired"


def test_a_stale_message_is_refused_before_its_signature_is_checked(pki: Path) -> None:
    """A replayed (or stale forged) envelope costs no ECDSA verification: the freshness check
    comes first, and it changes no state."""
    v = verifier(pki)
    topic = TOPICS_.topic("heartbeat", 1)
    s = signer(pki, "peer-1")
    old, new = s.seal(topic, BEAT), s.seal(topic, BEAT)
    assert v.open(topic, new) == BEAT
    env = msgpack.unpackb(old)
    env["sig"] = b"\x30" + b"\x00" * 70  # garbage: would fail verification
    refused(v, topic, msgpack.packb(env, use_bin_type=True), "replay", "a replayed or stale")
