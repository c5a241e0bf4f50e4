from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Codec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CODEC_UNSPECIFIED: _ClassVar[Codec]
    CODEC_NONE: _ClassVar[Codec]
    CODEC_FP16: _ClassVar[Codec]
    CODEC_BF16: _ClassVar[Codec]
    CODEC_INT8: _ClassVar[Codec]
    CODEC_TOPK: _ClassVar[Codec]
    CODEC_RANDOMK: _ClassVar[Codec]
    CODEC_SIGN: _ClassVar[Codec]
    CODEC_QSGD: _ClassVar[Codec]
    CODEC_PLUGIN: _ClassVar[Codec]

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_FLOAT16: _ClassVar[DType]
    DTYPE_BFLOAT16: _ClassVar[DType]
    DTYPE_INT8: _ClassVar[DType]
    DTYPE_INT32: _ClassVar[DType]
    DTYPE_UINT8: _ClassVar[DType]
    DTYPE_INT16: _ClassVar[DType]

class AckStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACK_STATUS_UNSPECIFIED: _ClassVar[AckStatus]
    ACK_OK: _ClassVar[AckStatus]
    ACK_LATE: _ClassVar[AckStatus]
CODEC_UNSPECIFIED: Codec
CODEC_NONE: Codec
CODEC_FP16: Codec
CODEC_BF16: Codec
CODEC_INT8: Codec
CODEC_TOPK: Codec
CODEC_RANDOMK: Codec
CODEC_SIGN: Codec
CODEC_QSGD: Codec
CODEC_PLUGIN: Codec
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT32: DType
DTYPE_FLOAT16: DType
DTYPE_BFLOAT16: DType
DTYPE_INT8: DType
DTYPE_INT32: DType
DTYPE_UINT8: DType
DTYPE_INT16: DType
ACK_STATUS_UNSPECIFIED: AckStatus
ACK_OK: AckStatus
ACK_LATE: AckStatus

class FetchRequest(_message.Message):
    __slots__ = ("run_id", "peer_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    peer_id: int
    def __init__(self, run_id: _Optional[str] = ..., peer_id: _Optional[int] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ("run_id", "peer_id", "protocol_version", "model_fingerprint", "codec")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    peer_id: int
    protocol_version: int
    model_fingerprint: str
    codec: Codec
    def __init__(self, run_id: _Optional[str] = ..., peer_id: _Optional[int] = ..., protocol_version: _Optional[int] = ..., model_fingerprint: _Optional[str] = ..., codec: _Optional[_Union[Codec, str]] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("accepted", "reason", "peer_id")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    peer_id: int
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., peer_id: _Optional[int] = ...) -> None: ...

class Part(_message.Message):
    __slots__ = ("name", "dtype", "numel", "offset")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUMEL_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    numel: int
    offset: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., numel: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class FrameHeader(_message.Message):
    __slots__ = ("run_id", "sender", "step", "round", "tensor_id", "codec", "chunk_index", "chunk_count", "byte_length", "parts", "chunk_offset", "dim", "push_weight")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TENSOR_ID_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    BYTE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    PUSH_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    sender: int
    step: int
    round: int
    tensor_id: int
    codec: Codec
    chunk_index: int
    chunk_count: int
    byte_length: int
    parts: _containers.RepeatedCompositeFieldContainer[Part]
    chunk_offset: int
    dim: int
    push_weight: float
    def __init__(self, run_id: _Optional[str] = ..., sender: _Optional[int] = ..., step: _Optional[int] = ..., round: _Optional[int] = ..., tensor_id: _Optional[int] = ..., codec: _Optional[_Union[Codec, str]] = ..., chunk_index: _Optional[int] = ..., chunk_count: _Optional[int] = ..., byte_length: _Optional[int] = ..., parts: _Optional[_Iterable[_Union[Part, _Mapping]]] = ..., chunk_offset: _Optional[int] = ..., dim: _Optional[int] = ..., push_weight: _Optional[float] = ...) -> None: ...

class TensorFrame(_message.Message):
    __slots__ = ("header", "body")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    header: FrameHeader
    body: bytes
    def __init__(self, header: _Optional[_Union[FrameHeader, _Mapping]] = ..., body: _Optional[bytes] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("receiver", "step", "round", "tensor_id", "status", "reason")
    RECEIVER_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TENSOR_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    receiver: int
    step: int
    round: int
    tensor_id: int
    status: AckStatus
    reason: str
    def __init__(self, receiver: _Optional[int] = ..., step: _Optional[int] = ..., round: _Optional[int] = ..., tensor_id: _Optional[int] = ..., status: _Optional[_Union[AckStatus, str]] = ..., reason: _Optional[str] = ...) -> None: ...
