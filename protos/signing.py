"""Signed control messages: who sent a message, checked by every receiver, independently of the
broker (docs/protocol.md#signed-control-messages).

When a run has a PKI (``[network.tls]``: the run CA of ``concord certs``), every control message
is wrapped by its sender in an envelope, a msgpack map::

    {"v": SCHEMA_VERSION, "kind": "signed", "run": RUN, "from": IDENTITY, "epoch": int,
     "seq": int, "conn": int, "will": bool, "topic": TOPIC, "body": <the encoded message>,
     "crt": <the sender's certificate, DER>, "sig": <ECDSA-SHA256, DER>}

``sig`` signs the canonical msgpack array ``[CONTEXT, run, from, epoch, seq, conn, will, topic,
body]`` with the key the run CA issued to the sender (peers: ``peer-<id>``, the orchestrator:
``orchestrator``); ``CONTEXT`` separates these signatures from anything else the same keys sign
(the data plane's TLS handshakes). A `Verifier` accepts an envelope only when

* its ``run`` is this run and its ``topic`` the topic it arrived on;
* ``from`` is the identity that topic requires: ``peer-<i>`` on ``status|heartbeat|stats|
  metrics/<i>``, ``orchestrator`` on the run-wide topics;
* ``crt`` chains to the run CA (checked once per certificate, cached by its SHA-256), is inside
  its validity window, is no CA, allows digital signatures and names ``from`` as its CN;
* ``sig`` verifies with the certificate's key;
* its ``epoch`` is not older than the newest incarnation of that sender accepted on any topic:
  ``epoch`` is the sender's wall clock (ns) when its `Signer` was made — one per process
  incarnation — so nothing of an earlier incarnation passes once a later one was heard;
* it is newer than what was accepted from that sender on that topic: (epoch, seq) strictly
  greater, ``seq`` counting the sender's messages from 1. So a replayed message and a retained
  message re-published after a reconnect are dropped. A second copy of the last accepted message
  (MQTT delivers QoS 1 at least once, and a message published while a receiver subscribes can
  reach it live and retained) is dropped as a "duplicate", which receivers do not report.

**Last-Wills** are signed when the connection is made (``will`` true, with the next ``seq``), but
the broker publishes them when the connection breaks, after everything the sender published
later. A will is therefore judged against that sender's earlier accepted wills on the same topic,
never against its ordinary messages (which carry higher sequence numbers) — and against ``conn``:
every envelope carries the seq of its sender's current will (a will: its own), so once a message
of a later connection was accepted, the will of an earlier connection is stale and dropped.

Every refusal is a `SignatureError` (a `PayloadError`) with the claimed sender and a short reason
key, so that a receiver logs it once per sender and reason (`concord.protos.mqtt.Bus`). This
module does not decode the body: `concord.protos.control_plane.decode` validates it afterwards.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import msgpack
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import NameOID

from concord.errors import CertError, ConfigError, PayloadError
from concord.protos.control_plane import (
    MAX_PAYLOAD_BYTES,
    ROOT,
    SCHEMA_VERSION,
    SIGNED_KIND,
    TOPICS,
)
from concord.protos.revocation import RevocationError, Revocations, fingerprint

if TYPE_CHECKING:
    from concord.core.config import RunConfig

ORCHESTRATOR = "orchestrator"
CONTEXT = "concord/v1 signed control message"
FIELDS = ("v", "kind", "run", "from", "epoch", "seq", "conn", "will", "topic", "body", "crt", "sig")
MAX_CERT_BYTES = 4096  # a P-256 leaf certificate is ~600 bytes
MAX_SIG_BYTES = 80  # a DER ECDSA P-256 signature is at most 72 bytes
MAX_ENVELOPE_BYTES = MAX_PAYLOAD_BYTES + MAX_CERT_BYTES + 1024
_CACHE_LIMIT = 1024  # certificates remembered (verified or refused)
_INT64 = 2**63 - 1


class SignatureError(PayloadError):
    """An envelope that is refused: ``sender`` is the identity it claims (as far as it could be
    read), ``reason`` a short key for counting and logging once ("unsigned", "replay", …)."""

    def __init__(self, topic: str, problem: str, *, sender: str, reason: str) -> None:
        super().__init__(topic, problem)
        self.sender = sender
        self.reason = reason


def required_identity(topic: str) -> str | None:
    """The identity that may publish on ``topic`` (``concord/v1/<run>/<kind>[/<peer>]``):
    ``peer-<i>`` on per-peer topics, "orchestrator" on the run-wide ones; None for a topic
    outside the contract."""
    levels = topic.split("/")
    if len(levels) < 4 or "/".join(levels[:2]) != ROOT:
        return None
    spec = TOPICS.get(levels[3])
    if spec is None:
        return None
    if spec.per_peer:
        if len(levels) != 5 or not levels[4].isascii() or not levels[4].isdigit():
            return None
        return f"peer-{int(levels[4])}"
    return ORCHESTRATOR if len(levels) == 4 else None


def _signed_bytes(
    run: str, sender: str, epoch: int, seq: int, conn: int, will: bool, topic: str, body: bytes
) -> bytes:
    packed: bytes = msgpack.packb(
        [CONTEXT, run, sender, epoch, seq, conn, will, topic, body], use_bin_type=True
    )
    return packed


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def _common_name(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = names[0].value if len(names) == 1 else None
    return value if isinstance(value, str) else ""


# ------------------------------------------------------------------------------------- signing


class Signer:
    """Signs one sender's control messages: ``identity`` ("orchestrator" or "peer-<id>", the CN
    of ``cert``), its private ``key``, the ``run`` id. ``epoch`` (default: now, in ns) marks this
    incarnation; every `seal` takes the next sequence number."""

    def __init__(
        self,
        identity: str,
        key: ec.EllipticCurvePrivateKey,
        cert: x509.Certificate,
        run: str,
        *,
        epoch: int | None = None,
    ) -> None:
        if _common_name(cert) != identity:
            raise CertError(
                f"the certificate's CN is {_common_name(cert)!r}, not the identity {identity!r}"
            )
        raw = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        if cert.public_key().public_bytes(*raw) != key.public_key().public_bytes(*raw):
            raise CertError(f"the private key does not belong to the certificate of {identity!r}")
        self.identity = identity
        self.key = key
        self.cert_der = _der(cert)
        self.run = run
        self.epoch = time.time_ns() if epoch is None else epoch
        self._seq = itertools.count(1)  # next() is atomic under the GIL
        self.conn = 0  # seq of the Last-Will of the current connection (0: none yet)

    @classmethod
    def load(cls, identity: str, key_path: Path, cert_path: Path, run: str) -> Signer:
        """From PEM files; CertError naming the file for anything unusable."""
        return cls(identity, _load_key(key_path), _load_cert(cert_path), run)

    def seal(self, topic: str, body: bytes, *, will: bool = False) -> bytes:
        """The envelope of ``body`` (an encoded message) for ``topic``, with the next sequence
        number. A Last-Will (sealed at each connect) starts a connection: its seq becomes the
        ``conn`` every later envelope carries, so a receiver can tell a stale will of an earlier
        connection from the current one."""
        seq = next(self._seq)
        if will:
            self.conn = seq
        conn = self.conn
        signed = _signed_bytes(self.run, self.identity, self.epoch, seq, conn, will, topic, body)
        sig = self.key.sign(signed, ec.ECDSA(hashes.SHA256()))
        envelope = {
            "v": SCHEMA_VERSION,
            "kind": SIGNED_KIND,
            "run": self.run,
            "from": self.identity,
            "epoch": self.epoch,
            "seq": seq,
            "conn": conn,
            "will": will,
            "topic": topic,
            "body": body,
            "crt": self.cert_der,
            "sig": sig,
        }
        packed: bytes = msgpack.packb(envelope, use_bin_type=True)
        return packed


# ---------------------------------------------------------------------------------- verifying


@dataclass(frozen=True)
class _Known:
    """A certificate that chains to the run CA (validity is checked on every use)."""

    cn: str
    key: ec.EllipticCurvePublicKey
    not_before: dt.datetime
    not_after: dt.datetime


class Verifier:
    """Checks envelopes against the run CA ``ca`` and the ``run`` id (see the module docstring);
    remembers, per (sender, topic, will), the newest (epoch, seq) accepted."""

    def __init__(
        self, ca: x509.Certificate, run: str, revocations: Revocations | None = None
    ) -> None:
        constraints = _basic_constraints(ca)
        if constraints is None or not constraints.ca:
            raise CertError("the run CA certificate lacks basicConstraints CA:true")
        self.ca = ca
        self.run = run
        self.revocations = revocations  # `concord certs revoke`'s list (None: not looked at)
        self._certs: dict[bytes, _Known | str] = {}  # sha256(DER) → verified, or why refused
        self._last: dict[tuple[str, str, bool], tuple[int, int]] = {}
        self._epoch: dict[str, int] = {}  # sender → newest incarnation accepted (any topic)
        self._conn: dict[str, tuple[int, int]] = {}  # sender → (epoch, newest conn seen)
        self.accepted = 0

    @classmethod
    def load(cls, ca_path: Path, run: str) -> Verifier:
        """The verifier of the run CA at ``ca_path``, honouring the revocation list beside it
        (`concord.protos.revocation`)."""
        ca = _load_cert(ca_path, "run CA certificate")
        try:
            revocations = Revocations.for_ca(ca_path)
        except RevocationError as exc:
            raise CertError(str(exc)) from None
        return cls(ca, run, revocations)

    def _revoked(self, der: bytes) -> bool:
        return self.revocations is not None and fingerprint(der) in self.revocations

    def open(self, topic: str, payload: bytes, *, now: dt.datetime | None = None) -> bytes:
        """The body of the envelope ``payload`` received on ``topic``, once every check passed;
        `SignatureError` saying which one failed otherwise."""
        env = self._parse(topic, payload)
        sender: str = env["from"]

        def refuse(reason: str, problem: str) -> SignatureError:
            return SignatureError(topic, problem, sender=sender, reason=reason)

        if env["run"] != self.run:
            raise refuse("run", f"signed for run {env['run']!r}, not this run {self.run!r}")
        if env["topic"] != topic:
            raise refuse("topic", f"signed for topic {env['topic']!r}, received on another topic")
        required = required_identity(topic)
        if required != sender:
            raise refuse(
                "identity",
                f"signed by {sender!r}, but only {required!r} may publish on this topic",
            )
        known = self._certificate(env["crt"])
        if isinstance(known, str):
            raise refuse("certificate", f"the sender's certificate {known}")
        if self._revoked(env["crt"]):
            raise refuse("revoked", "the sender's certificate is revoked (the run's revoked.txt)")
        at = now or dt.datetime.now(dt.UTC)
        if not known.not_before <= at <= known.not_after:
            raise refuse(
                "expired",
                f"the sender's certificate (with the run CA) is valid "
                f"{known.not_before:%Y-%m-%d %H:%M} to {known.not_after:%Y-%m-%d %H:%M} UTC, "
                "not now",
            )
        if known.cn != sender:
            raise refuse("identity", f"claims {sender!r}, but its certificate is {known.cn!r}")
        epoch, seq, conn, will = env["epoch"], env["seq"], env["conn"], env["will"]
        # stale before costly: a replay is refused without an ECDSA verification (a flood of
        # old messages costs no CPU); the state is updated only after the signature verified
        self._check_fresh(sender, topic, epoch, seq, will, refuse)
        signed = _signed_bytes(self.run, sender, epoch, seq, conn, will, topic, env["body"])
        try:
            known.key.verify(env["sig"], signed, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            raise refuse("signature", "the signature does not verify") from None
        self._last[(sender, topic, will)] = (epoch, seq)
        newest = self._conn.get(sender, (0, 0))
        self._epoch[sender] = epoch
        if (epoch, conn) > newest:
            self._conn[sender] = (epoch, conn)
        self.accepted += 1
        body: bytes = env["body"]
        return body

    def _check_fresh(
        self,
        sender: str,
        topic: str,
        epoch: int,
        seq: int,
        will: bool,
        refuse: Callable[[str, str], SignatureError],
    ) -> None:
        """Refuse what is not newer than what was accepted (module docstring); no state change."""
        floor = self._epoch.get(sender, 0)
        if epoch < floor:  # whatever the topic: that incarnation is over
            raise refuse(
                "replay",
                f"an earlier incarnation's {'Last-Will' if will else 'message'} (epoch {epoch}; "
                f"{sender} is at epoch {floor})",
            )
        newest = self._conn.get(sender, (0, 0))
        if will and newest[0] == epoch and seq < newest[1]:
            raise refuse(
                "replay",
                f"a stale Last-Will of an earlier connection (seq {seq}; {sender}'s current "
                f"connection began at seq {newest[1]})",
            )
        last = self._last.get((sender, topic, will))
        if last is not None and (epoch, seq) == last:  # QoS 1 is at-least-once; retained + live
            raise refuse("duplicate", "a second copy of the last accepted message")
        if last is not None and (epoch, seq) < last:
            what = "an earlier incarnation's" if epoch < last[0] else "a replayed or stale"
            raise refuse(
                "replay",
                f"{what} {'Last-Will' if will else 'message'} (epoch {epoch}, seq {seq}; "
                f"accepted up to epoch {last[0]}, seq {last[1]})",
            )

    def _parse(self, topic: str, payload: bytes) -> dict[str, Any]:
        claimed = required_identity(topic) or "?"

        def refuse(reason: str, problem: str) -> SignatureError:
            return SignatureError(topic, problem, sender=claimed, reason=reason)

        if len(payload) > MAX_ENVELOPE_BYTES:
            raise refuse("malformed", f"envelope of {len(payload)} bytes exceeds the limit")
        try:
            env = msgpack.unpackb(
                payload,
                raw=False,
                strict_map_key=True,
                max_bin_len=MAX_ENVELOPE_BYTES,
                max_str_len=MAX_PAYLOAD_BYTES,
                max_array_len=1024,
                max_map_len=1024,
            )
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            raise refuse("malformed", f"not a msgpack map ({type(exc).__name__})") from None
        if not isinstance(env, dict):
            raise refuse("malformed", f"payload must be a msgpack map, got {type(env).__name__}")
        if env.get("kind") != SIGNED_KIND:
            raise refuse(
                "unsigned",
                "unsigned message on a run with a PKI (every control message must be signed "
                "by its sender: network.tls.sign_control)",
            )
        if env.get("v") != SCHEMA_VERSION:
            raise refuse(
                "malformed",
                f"schema version {env.get('v')!r} is not supported (this build speaks "
                f"{SCHEMA_VERSION})",
            )
        unknown = sorted(str(k) for k in env if k not in FIELDS)
        missing = [k for k in FIELDS if k not in env]
        if unknown or missing:
            parts = [f"unknown field(s) {', '.join(unknown)}"] if unknown else []
            parts += [f"missing field(s) {', '.join(missing)}"] if missing else []
            raise refuse("malformed", f"signed envelope has {'; '.join(parts)}")
        sender = env["from"]
        if isinstance(sender, str) and 0 < len(sender) <= 64:
            claimed = sender
        checks = (
            ("run", str, 64),
            ("from", str, 64),
            ("topic", str, 1024),
            ("body", bytes, MAX_PAYLOAD_BYTES),
            ("crt", bytes, MAX_CERT_BYTES),
            ("sig", bytes, MAX_SIG_BYTES),
        )
        for name, kind, limit in checks:
            value = env[name]
            if not isinstance(value, kind) or not 0 < len(value) <= limit:
                raise refuse(
                    "malformed",
                    f"signed envelope field {name!r} must be a non-empty {kind.__name__} of at "
                    f"most {limit} bytes; got {type(value).__name__}",
                )
        for name in ("epoch", "seq", "conn"):
            value = env[name]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _INT64:
                raise refuse(
                    "malformed", f"signed envelope field {name!r} must be an int in [0, 2^63)"
                )
        if not isinstance(env["will"], bool):
            raise refuse("malformed", "signed envelope field 'will' must be a bool")
        if env["conn"] > env["seq"] or (env["will"] and env["conn"] != env["seq"]):
            raise refuse(
                "malformed",
                "signed envelope field 'conn' must be the seq of the sender's current Last-Will "
                "(its own seq for a will, at most the seq otherwise)",
            )
        return env

    def certificate_problem(self, der: bytes, *, now: dt.datetime | None = None) -> str | None:
        """Why the certificate ``der`` cannot sign this run's messages now (None: it can)."""
        known = self._certificate(der)
        if isinstance(known, str):
            return known
        if self._revoked(der):
            return (
                "is revoked (listed in the run's revoked.txt by `concord certs revoke`): issue a "
                "new one with `concord certs issue`"
            )
        at = now or dt.datetime.now(dt.UTC)
        if not known.not_before <= at <= known.not_after:
            return f"is not valid now ({known.not_before:%Y-%m-%d} to {known.not_after:%Y-%m-%d})"
        return None

    def _certificate(self, der: bytes) -> _Known | str:
        """The verified certificate ``der``, or why it is refused (both cached)."""
        digest = hashlib.sha256(der).digest()
        found = self._certs.get(digest)
        if found is None:
            found = self._check(der)
            if len(self._certs) >= _CACHE_LIMIT:
                self._certs.clear()  # bounded: a flood of bogus certificates costs only time
            self._certs[digest] = found
        return found

    def _check(self, der: bytes) -> _Known | str:
        try:  # cryptography parses some parts lazily: any access may raise
            with warnings.catch_warnings():  # e.g. a non-positive serial number: refused too
                warnings.simplefilter("error", CryptographyDeprecationWarning)
                return self._check_parsed(x509.load_der_x509_certificate(der))
        except (ValueError, TypeError, x509.InvalidVersion, CryptographyDeprecationWarning) as exc:
            return f"is not a valid DER certificate ({exc})"[:200]

    def _check_parsed(self, cert: x509.Certificate) -> _Known | str:
        if cert.issuer != self.ca.subject:
            return f"is not issued by the run CA (issuer {cert.issuer.rfc4514_string()!r})"
        try:
            cert.verify_directly_issued_by(self.ca)
        except (ValueError, TypeError, InvalidSignature):
            return "does not verify against the run CA"
        constraints = _basic_constraints(cert)
        if constraints is not None and constraints.ca:
            return "is a CA certificate, not a sender's"
        try:
            usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
        except x509.ExtensionNotFound:
            usage = None
        if usage is not None and not usage.digital_signature:
            return "does not allow digital signatures (keyUsage)"
        key = cert.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey):
            return f"has a {type(key).__name__}, not an EC key"
        # a signature is good while both the sender's certificate and the run CA are valid
        return _Known(
            _common_name(cert),
            key,
            max(cert.not_valid_before_utc, self.ca.not_valid_before_utc),
            min(cert.not_valid_after_utc, self.ca.not_valid_after_utc),
        )


def _basic_constraints(cert: x509.Certificate) -> x509.BasicConstraints | None:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return None


def _load_cert(path: Path, what: str = "certificate") -> x509.Certificate:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CertError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError:
        raise CertError(f"the {what} {path} is not a PEM certificate") from None


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CertError(f"cannot read the private key {path}: {exc.strerror or exc}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise CertError(f"the private key {path} is not an unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError(f"the private key {path} is a {type(key).__name__}; expected an EC key")
    return key


# --------------------------------------------------------------------------- from the run config


class Signing(NamedTuple):
    """What a participant's `Bus` signs with and verifies with (None: it does not)."""

    signer: Signer | None = None
    verifier: Verifier | None = None


def signing_for(cfg: RunConfig, identity: str, run: str) -> Signing:
    """The signer and verifier of ``identity`` ("orchestrator", "peer-<id>" or "monitor", which
    only verifies) in run ``run``: both None unless ``network.tls`` is set and its
    ``sign_control`` is true. ConfigError naming the ``network.tls`` key for unusable files."""
    tls = cfg.network.tls
    if tls is None or not tls.sign_control:
        return Signing()
    peer = identity.removeprefix("peer-") if identity.startswith("peer-") else None

    def path(key: str, template: str) -> Path:
        if "{id}" in template and peer is None:
            raise ConfigError(
                [(f"network.tls.{key}", f"{template!r} holds {{id}}, but {identity} has no id")]
            )
        return Path(template.replace("{id}", peer or ""))

    def wrap(key: str, exc: CertError) -> ConfigError:
        return ConfigError([(f"network.tls.{key}", f"{exc} (signed control messages)")])

    try:
        verifier = Verifier.load(path("ca", tls.ca), run)
    except CertError as exc:
        raise wrap("ca", exc) from None
    if identity == ORCHESTRATOR:
        directory = Path(tls.ca).parent
        cert_key = "orchestrator_cert"
        cert = Path(tls.orchestrator_cert or directory / "orchestrator.crt")
        key = Path(tls.orchestrator_key or directory / "orchestrator.key")
        hint = (
            "; issue it with `concord certs issue --orchestrator`"
            if tls.orchestrator_cert is None
            else ""
        )
    elif peer is not None:
        cert_key, cert, key, hint = "cert", path("cert", tls.cert), path("key", tls.key), ""
    else:
        return Signing(None, verifier)
    try:
        signer = Signer.load(identity, key, cert, run)
    except CertError as exc:
        raise wrap(cert_key, CertError(f"{exc}{hint}")) from None
    # the sender's own certificate, checked here: otherwise every receiver refuses its messages
    problem = verifier.certificate_problem(signer.cert_der)
    if problem is not None:
        raise wrap(cert_key, CertError(f"the certificate {cert} {problem}"))
    return Signing(signer, verifier)
