"""Compression codecs for gossip tensors, shared by both engines.

A codec turns a float32 vector x ∈ R^d into named flat parts for the wire (`Encoded`) and back.
``decode(encode(x))`` is the compression operator Q of CHOCO-SGD (Koloskova, Stich & Jaggi, ICML
2019; ICLR 2020). `Codec.roundtrip` applies Q to all k local rows at once; it runs the *same*
row-batched kernels as encode/decode (which are the k = 1 case), so its output is bitwise
identical to the per-row path. That is what lets the vectorized engine predict real peers exactly.

| codec   | parts on the wire, in order                | Q(x)                                 |
| ------- | ------------------------------------------ | ------------------------------------ |
| none    | values fp32 [d]                            | x                                    |
| fp16    | values fp16 [d]                            | fp32(fp16(x))  (range ±65504)        |
| bf16    | values bf16 [d]                            | fp32(bf16(x))                        |
| int8    | scale fp32 [1], values int8 [d]            | s·round(x/s), s = max|x_j|/127       |
| topk    | values fp32 [m], indices int32 [m] (sorted)| x on the m largest |x_j|, 0 elsewhere|
| randomk | values fp32 [m] (indices from the key)     | x on m seeded random coords, 0 else  |
| sign    | scale fp32 [1], bits uint8 [⌈d/8⌉]         | (‖x‖₁/d)·sign(x), sign(0) = +1       |
| qsgd    | scale fp32 [1], levels int8 [d] (s ≤ 127)  | τ‖x‖₂·sign(x)·ℓ/s, ℓ = |x|/‖x‖₂·s    |
|         | or int16 [d] (127 < s ≤ 32767)             | rounded stochastically to 0 … s      |

Hyperparameters: ``ratio`` ∈ (0, 1] — topk/randomk keep m = max(1, round(ratio·d)) coordinates;
``seed`` (any int) — with the message key it seeds random codecs; ``levels`` s ∈ [1, 32767] —
qsgd's grid (default 16, the CHOCO convex code's "4-bit"). topk/randomk are the biased (unscaled,
no d/m factor) versions of the CHOCO code; sign is its ℓ₁-scaled variant
(docs/algorithms.md#compression-codecs). qsgd by default is CHOCO's biased, variance-reduced
version, τ = 1/(1 + min(d/s², √d/s)) and E Q(x) = τx; with ``unbiased`` (config
``compression.unbiased``) τ = 1 and E Q(x) = x. int8 is per-tensor symmetric absmax quantisation
written with plain tensor ops (``torch.quantize_per_tensor`` is deprecated,
docs/transport.md#codec-cost); `Int8` optionally rounds stochastically (unbiased), drawing from the
message's generator.

Randomness: random codecs (randomk, qsgd, stochastic int8) draw from a `torch.Generator` seeded
by mixing (seed, key), where key = `codec_key(sender, round)`. Sender and receivers derive the
same generator, so random-k indices are regenerated rather than sent; peers must run the same
torch version.

Sign bits are little-endian within a byte: coordinate 8b + i is bit i of byte b (1 = x ≥ 0);
padding bits are 0. Scalar parts come first so every part of a payload stays 4-byte aligned.
"""

from concord.core.compress import quantize, sparse  # noqa: F401  (register the codecs)
from concord.core.compress.base import (
    CODEC_NAMES,
    CODECS,
    MAX_SENDERS,
    Codec,
    CodecError,
    Encoded,
    codec_key,
    make_codec,
    message_generator,
)
from concord.core.compress.quantize import BF16, FP16, QSGD, Int8, NoCodec, Sign
from concord.core.compress.sparse import RandomK, TopK

__all__ = [
    "BF16",
    "CODECS",
    "CODEC_NAMES",
    "FP16",
    "MAX_SENDERS",
    "QSGD",
    "Codec",
    "CodecError",
    "Encoded",
    "Int8",
    "NoCodec",
    "RandomK",
    "Sign",
    "TopK",
    "codec_key",
    "make_codec",
    "message_generator",
]
