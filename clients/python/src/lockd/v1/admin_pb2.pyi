from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_FOLLOWER: _ClassVar[Role]
    ROLE_CANDIDATE: _ClassVar[Role]
    ROLE_LEADER: _ClassVar[Role]
    ROLE_LEARNER: _ClassVar[Role]
    ROLE_SHUTDOWN: _ClassVar[Role]
ROLE_UNSPECIFIED: Role
ROLE_FOLLOWER: Role
ROLE_CANDIDATE: Role
ROLE_LEADER: Role
ROLE_LEARNER: Role
ROLE_SHUTDOWN: Role

class Member(_message.Message):
    __slots__ = ("node_id", "addr", "voter")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    VOTER_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    addr: str
    voter: bool
    def __init__(self, node_id: _Optional[int] = ..., addr: _Optional[str] = ..., voter: bool = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("node_id", "role", "current_term", "leader_id", "leader_addr", "commit_index", "applied_index", "last_log_index", "members", "cluster_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDR_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    role: Role
    current_term: int
    leader_id: int
    leader_addr: str
    commit_index: int
    applied_index: int
    last_log_index: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    cluster_id: str
    def __init__(self, node_id: _Optional[int] = ..., role: _Optional[_Union[Role, str]] = ..., current_term: _Optional[int] = ..., leader_id: _Optional[int] = ..., leader_addr: _Optional[str] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., last_log_index: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class InitRequest(_message.Message):
    __slots__ = ("members",)
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class InitResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AddLearnerRequest(_message.Message):
    __slots__ = ("member",)
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    member: Member
    def __init__(self, member: _Optional[_Union[Member, _Mapping]] = ...) -> None: ...

class AddLearnerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ChangeMembershipRequest(_message.Message):
    __slots__ = ("voter_ids", "retain")
    VOTER_IDS_FIELD_NUMBER: _ClassVar[int]
    RETAIN_FIELD_NUMBER: _ClassVar[int]
    voter_ids: _containers.RepeatedScalarFieldContainer[int]
    retain: bool
    def __init__(self, voter_ids: _Optional[_Iterable[int]] = ..., retain: bool = ...) -> None: ...

class ChangeMembershipResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRevocationsRequest(_message.Message):
    __slots__ = ("key", "page_size", "page_token")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    key: str
    page_size: int
    page_token: str
    def __init__(self, key: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRevocationsResponse(_message.Message):
    __slots__ = ("revocations", "next_page_token")
    REVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    revocations: _containers.RepeatedCompositeFieldContainer[RevocationRecord]
    next_page_token: str
    def __init__(self, revocations: _Optional[_Iterable[_Union[RevocationRecord, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RevocationRecord(_message.Message):
    __slots__ = ("key", "operator", "reason", "previous_owner_id", "previous_token", "new_token_floor", "revoked_at_unix_ms", "request_id")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKEN_FLOOR_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    key: str
    operator: str
    reason: str
    previous_owner_id: str
    previous_token: int
    new_token_floor: int
    revoked_at_unix_ms: int
    request_id: int
    def __init__(self, key: _Optional[str] = ..., operator: _Optional[str] = ..., reason: _Optional[str] = ..., previous_owner_id: _Optional[str] = ..., previous_token: _Optional[int] = ..., new_token_floor: _Optional[int] = ..., revoked_at_unix_ms: _Optional[int] = ..., request_id: _Optional[int] = ...) -> None: ...
