from lockd.v1 import error_pb2 as _error_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PipelineRequest(_message.Message):
    __slots__ = ("call_id", "timeout_ms", "acquire", "try_acquire", "cancel_acquire", "renew", "release")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    TRY_ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    RENEW_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    call_id: int
    timeout_ms: int
    acquire: AcquireRequest
    try_acquire: TryAcquireRequest
    cancel_acquire: CancelAcquireRequest
    renew: RenewRequest
    release: ReleaseRequest
    def __init__(self, call_id: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., acquire: _Optional[_Union[AcquireRequest, _Mapping]] = ..., try_acquire: _Optional[_Union[TryAcquireRequest, _Mapping]] = ..., cancel_acquire: _Optional[_Union[CancelAcquireRequest, _Mapping]] = ..., renew: _Optional[_Union[RenewRequest, _Mapping]] = ..., release: _Optional[_Union[ReleaseRequest, _Mapping]] = ...) -> None: ...

class PipelineResponse(_message.Message):
    __slots__ = ("call_id", "acquire", "cancel_acquire", "renew", "release", "error")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    RENEW_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    call_id: int
    acquire: AcquireResponse
    cancel_acquire: CancelAcquireResponse
    renew: RenewResponse
    release: ReleaseResponse
    error: _error_pb2.ErrorDetail
    def __init__(self, call_id: _Optional[int] = ..., acquire: _Optional[_Union[AcquireResponse, _Mapping]] = ..., cancel_acquire: _Optional[_Union[CancelAcquireResponse, _Mapping]] = ..., renew: _Optional[_Union[RenewResponse, _Mapping]] = ..., release: _Optional[_Union[ReleaseResponse, _Mapping]] = ..., error: _Optional[_Union[_error_pb2.ErrorDetail, _Mapping]] = ...) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("session_id", "request_id", "key", "ttl_ms", "max_wait_ms")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    request_id: int
    key: str
    ttl_ms: int
    max_wait_ms: int
    def __init__(self, session_id: _Optional[str] = ..., request_id: _Optional[int] = ..., key: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., max_wait_ms: _Optional[int] = ...) -> None: ...

class TryAcquireRequest(_message.Message):
    __slots__ = ("session_id", "request_id", "key", "ttl_ms")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    request_id: int
    key: str
    ttl_ms: int
    def __init__(self, session_id: _Optional[str] = ..., request_id: _Optional[int] = ..., key: _Optional[str] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("grant",)
    GRANT_FIELD_NUMBER: _ClassVar[int]
    grant: Grant
    def __init__(self, grant: _Optional[_Union[Grant, _Mapping]] = ...) -> None: ...

class Grant(_message.Message):
    __slots__ = ("key", "owner_id", "session_id", "fencing_token", "ttl_ms", "server_expiry_unix_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    SERVER_EXPIRY_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    key: str
    owner_id: str
    session_id: str
    fencing_token: int
    ttl_ms: int
    server_expiry_unix_ms: int
    def __init__(self, key: _Optional[str] = ..., owner_id: _Optional[str] = ..., session_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., server_expiry_unix_ms: _Optional[int] = ...) -> None: ...

class CancelAcquireRequest(_message.Message):
    __slots__ = ("session_id", "request_id", "key")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    request_id: int
    key: str
    def __init__(self, session_id: _Optional[str] = ..., request_id: _Optional[int] = ..., key: _Optional[str] = ...) -> None: ...

class CancelAcquireResponse(_message.Message):
    __slots__ = ("released_grant",)
    RELEASED_GRANT_FIELD_NUMBER: _ClassVar[int]
    released_grant: bool
    def __init__(self, released_grant: bool = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("session_id", "request_id", "key", "fencing_token", "ttl_ms")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    request_id: int
    key: str
    fencing_token: int
    ttl_ms: int
    def __init__(self, session_id: _Optional[str] = ..., request_id: _Optional[int] = ..., key: _Optional[str] = ..., fencing_token: _Optional[int] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("grant",)
    GRANT_FIELD_NUMBER: _ClassVar[int]
    grant: Grant
    def __init__(self, grant: _Optional[_Union[Grant, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session_id", "request_id", "key", "fencing_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    request_id: int
    key: str
    fencing_token: int
    def __init__(self, session_id: _Optional[str] = ..., request_id: _Optional[int] = ..., key: _Optional[str] = ..., fencing_token: _Optional[int] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: bool = ...) -> None: ...

class InspectRequest(_message.Message):
    __slots__ = ("key", "leader_confirmed")
    KEY_FIELD_NUMBER: _ClassVar[int]
    LEADER_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    key: str
    leader_confirmed: bool
    def __init__(self, key: _Optional[str] = ..., leader_confirmed: bool = ...) -> None: ...

class InspectResponse(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: LockInfo
    def __init__(self, info: _Optional[_Union[LockInfo, _Mapping]] = ...) -> None: ...

class LockInfo(_message.Message):
    __slots__ = ("key", "owner_id", "session_id", "fencing_token", "acquired_at_unix_ms", "expires_at_unix_ms", "waiter_count")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    WAITER_COUNT_FIELD_NUMBER: _ClassVar[int]
    key: str
    owner_id: str
    session_id: str
    fencing_token: int
    acquired_at_unix_ms: int
    expires_at_unix_ms: int
    waiter_count: int
    def __init__(self, key: _Optional[str] = ..., owner_id: _Optional[str] = ..., session_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., acquired_at_unix_ms: _Optional[int] = ..., expires_at_unix_ms: _Optional[int] = ..., waiter_count: _Optional[int] = ...) -> None: ...

class ForceRevokeRequest(_message.Message):
    __slots__ = ("key", "operator", "reason", "request_id")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    key: str
    operator: str
    reason: str
    request_id: int
    def __init__(self, key: _Optional[str] = ..., operator: _Optional[str] = ..., reason: _Optional[str] = ..., request_id: _Optional[int] = ...) -> None: ...

class ForceRevokeResponse(_message.Message):
    __slots__ = ("outcome",)
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    outcome: LockOutcome
    def __init__(self, outcome: _Optional[_Union[LockOutcome, _Mapping]] = ...) -> None: ...

class LockOutcome(_message.Message):
    __slots__ = ("key", "revoked", "previous_owner_id", "previous_token", "new_token_floor")
    KEY_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKEN_FLOOR_FIELD_NUMBER: _ClassVar[int]
    key: str
    revoked: bool
    previous_owner_id: str
    previous_token: int
    new_token_floor: int
    def __init__(self, key: _Optional[str] = ..., revoked: bool = ..., previous_owner_id: _Optional[str] = ..., previous_token: _Optional[int] = ..., new_token_floor: _Optional[int] = ...) -> None: ...
