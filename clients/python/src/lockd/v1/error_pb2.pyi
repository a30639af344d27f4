from google.protobuf import any_pb2 as _any_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RpcStatus(_message.Message):
    __slots__ = ("code", "message", "details")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    details: _containers.RepeatedCompositeFieldContainer[_any_pb2.Any]
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., details: _Optional[_Iterable[_Union[_any_pb2.Any, _Mapping]]] = ...) -> None: ...

class ErrorDetail(_message.Message):
    __slots__ = ("not_leader", "fenced_out", "contention", "invalid_argument", "lock_lost", "unauthenticated", "permission_denied")
    NOT_LEADER_FIELD_NUMBER: _ClassVar[int]
    FENCED_OUT_FIELD_NUMBER: _ClassVar[int]
    CONTENTION_FIELD_NUMBER: _ClassVar[int]
    INVALID_ARGUMENT_FIELD_NUMBER: _ClassVar[int]
    LOCK_LOST_FIELD_NUMBER: _ClassVar[int]
    UNAUTHENTICATED_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_DENIED_FIELD_NUMBER: _ClassVar[int]
    not_leader: NotLeader
    fenced_out: FencedOut
    contention: Contention
    invalid_argument: InvalidArgument
    lock_lost: LockLost
    unauthenticated: Unauthenticated
    permission_denied: PermissionDenied
    def __init__(self, not_leader: _Optional[_Union[NotLeader, _Mapping]] = ..., fenced_out: _Optional[_Union[FencedOut, _Mapping]] = ..., contention: _Optional[_Union[Contention, _Mapping]] = ..., invalid_argument: _Optional[_Union[InvalidArgument, _Mapping]] = ..., lock_lost: _Optional[_Union[LockLost, _Mapping]] = ..., unauthenticated: _Optional[_Union[Unauthenticated, _Mapping]] = ..., permission_denied: _Optional[_Union[PermissionDenied, _Mapping]] = ...) -> None: ...

class NotLeader(_message.Message):
    __slots__ = ("leader_id", "leader_addr")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDR_FIELD_NUMBER: _ClassVar[int]
    leader_id: int
    leader_addr: str
    def __init__(self, leader_id: _Optional[int] = ..., leader_addr: _Optional[str] = ...) -> None: ...

class FencedOut(_message.Message):
    __slots__ = ("key", "presented", "stored")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PRESENTED_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    key: str
    presented: int
    stored: int
    def __init__(self, key: _Optional[str] = ..., presented: _Optional[int] = ..., stored: _Optional[int] = ...) -> None: ...

class Contention(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class InvalidArgument(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class LockLost(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class Unauthenticated(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class PermissionDenied(_message.Message):
    __slots__ = ("principal", "required_role")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_ROLE_FIELD_NUMBER: _ClassVar[int]
    principal: str
    required_role: str
    def __init__(self, principal: _Optional[str] = ..., required_role: _Optional[str] = ...) -> None: ...
