from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Value(_message.Message):
    __slots__ = ("number", "text", "boolean", "null", "json", "integer")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    BOOLEAN_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    INTEGER_FIELD_NUMBER: _ClassVar[int]
    number: float
    text: str
    boolean: bool
    null: bool
    json: str
    integer: int
    def __init__(self, number: _Optional[float] = ..., text: _Optional[str] = ..., boolean: _Optional[bool] = ..., null: _Optional[bool] = ..., json: _Optional[str] = ..., integer: _Optional[int] = ...) -> None: ...

class Metadata(_message.Message):
    __slots__ = ("name", "type", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    value: Value
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...

class Attribute(_message.Message):
    __slots__ = ("name", "type", "value", "metadata")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    value: Value
    metadata: _containers.RepeatedCompositeFieldContainer[Metadata]
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ..., metadata: _Optional[_Iterable[_Union[Metadata, _Mapping]]] = ...) -> None: ...

class Entity(_message.Message):
    __slots__ = ("id", "type", "tenant", "service_path", "attributes")
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SERVICE_PATH_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    id: str
    type: str
    tenant: str
    service_path: str
    attributes: _containers.RepeatedCompositeFieldContainer[Attribute]
    def __init__(self, id: _Optional[str] = ..., type: _Optional[str] = ..., tenant: _Optional[str] = ..., service_path: _Optional[str] = ..., attributes: _Optional[_Iterable[_Union[Attribute, _Mapping]]] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("batch", "publisher", "first_sequence", "entities", "store", "incarnation", "held_back")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ENTITIES_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    HELD_BACK_FIELD_NUMBER: _ClassVar[int]
    batch: int
    publisher: str
    first_sequence: int
    entities: _containers.RepeatedCompositeFieldContainer[Entity]
    store: bool
    incarnation: int
    held_back: bool
    def __init__(self, batch: _Optional[int] = ..., publisher: _Optional[str] = ..., first_sequence: _Optional[int] = ..., entities: _Optional[_Iterable[_Union[Entity, _Mapping]]] = ..., store: _Optional[bool] = ..., incarnation: _Optional[int] = ..., held_back: _Optional[bool] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class PublishAck(_message.Message):
    __slots__ = ("batch", "accepted", "error", "moved_to")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MOVED_TO_FIELD_NUMBER: _ClassVar[int]
    batch: int
    accepted: int
    error: Error
    moved_to: str
    def __init__(self, batch: _Optional[int] = ..., accepted: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., moved_to: _Optional[str] = ...) -> None: ...

class EntitySelector(_message.Message):
    __slots__ = ("id", "id_pattern", "type", "type_pattern")
    ID_FIELD_NUMBER: _ClassVar[int]
    ID_PATTERN_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TYPE_PATTERN_FIELD_NUMBER: _ClassVar[int]
    id: str
    id_pattern: str
    type: str
    type_pattern: str
    def __init__(self, id: _Optional[str] = ..., id_pattern: _Optional[str] = ..., type: _Optional[str] = ..., type_pattern: _Optional[str] = ...) -> None: ...

class SubscriptionSpec(_message.Message):
    __slots__ = ("id", "entities", "tenant", "service_path", "condition_attrs", "q", "mq", "description", "expires", "attrs")
    ID_FIELD_NUMBER: _ClassVar[int]
    ENTITIES_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SERVICE_PATH_FIELD_NUMBER: _ClassVar[int]
    CONDITION_ATTRS_FIELD_NUMBER: _ClassVar[int]
    Q_FIELD_NUMBER: _ClassVar[int]
    MQ_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    id: str
    entities: _containers.RepeatedCompositeFieldContainer[EntitySelector]
    tenant: str
    service_path: str
    condition_attrs: _containers.RepeatedScalarFieldContainer[str]
    q: str
    mq: str
    description: str
    expires: float
    attrs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., entities: _Optional[_Iterable[_Union[EntitySelector, _Mapping]]] = ..., tenant: _Optional[str] = ..., service_path: _Optional[str] = ..., condition_attrs: _Optional[_Iterable[str]] = ..., q: _Optional[str] = ..., mq: _Optional[str] = ..., description: _Optional[str] = ..., expires: _Optional[float] = ..., attrs: _Optional[_Iterable[str]] = ...) -> None: ...

class Subscribe(_message.Message):
    __slots__ = ("subscriptions", "replace", "resume")
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedCompositeFieldContainer[SubscriptionSpec]
    replace: bool
    resume: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, subscriptions: _Optional[_Iterable[_Union[SubscriptionSpec, _Mapping]]] = ..., replace: _Optional[bool] = ..., resume: _Optional[_Iterable[int]] = ...) -> None: ...

class Unsubscribe(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("request", "subscribe", "unsubscribe", "release")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    UNSUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    request: int
    subscribe: Subscribe
    unsubscribe: Unsubscribe
    release: Release
    def __init__(self, request: _Optional[int] = ..., subscribe: _Optional[_Union[Subscribe, _Mapping]] = ..., unsubscribe: _Optional[_Union[Unsubscribe, _Mapping]] = ..., release: _Optional[_Union[Release, _Mapping]] = ...) -> None: ...

class Release(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Moved(_message.Message):
    __slots__ = ("address", "connection_point")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONNECTION_POINT_FIELD_NUMBER: _ClassVar[int]
    address: str
    connection_point: str
    def __init__(self, address: _Optional[str] = ..., connection_point: _Optional[str] = ...) -> None: ...

class SessionAck(_message.Message):
    __slots__ = ("request", "ids", "handles", "error")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request: int
    ids: _containers.RepeatedScalarFieldContainer[str]
    handles: _containers.RepeatedScalarFieldContainer[int]
    error: Error
    def __init__(self, request: _Optional[int] = ..., ids: _Optional[_Iterable[str]] = ..., handles: _Optional[_Iterable[int]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class NotificationBatch(_message.Message):
    __slots__ = ("entities", "publishers", "sequences", "entity_index", "handles", "replayed", "incarnation")
    ENTITIES_FIELD_NUMBER: _ClassVar[int]
    PUBLISHERS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    ENTITY_INDEX_FIELD_NUMBER: _ClassVar[int]
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    entities: _containers.RepeatedCompositeFieldContainer[Entity]
    publishers: _containers.RepeatedScalarFieldContainer[str]
    sequences: _containers.RepeatedScalarFieldContainer[int]
    entity_index: bytes
    handles: bytes
    replayed: bool
    incarnation: int
    def __init__(self, entities: _Optional[_Iterable[_Union[Entity, _Mapping]]] = ..., publishers: _Optional[_Iterable[str]] = ..., sequences: _Optional[_Iterable[int]] = ..., entity_index: _Optional[bytes] = ..., handles: _Optional[bytes] = ..., replayed: _Optional[bool] = ..., incarnation: _Optional[int] = ...) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ("ack", "notifications", "moved")
    ACK_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATIONS_FIELD_NUMBER: _ClassVar[int]
    MOVED_FIELD_NUMBER: _ClassVar[int]
    ack: SessionAck
    notifications: NotificationBatch
    moved: Moved
    def __init__(self, ack: _Optional[_Union[SessionAck, _Mapping]] = ..., notifications: _Optional[_Union[NotificationBatch, _Mapping]] = ..., moved: _Optional[_Union[Moved, _Mapping]] = ...) -> None: ...

class QueryRequest(_message.Message):
    __slots__ = ("tenant", "service_path", "entity_id", "params")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SERVICE_PATH_FIELD_NUMBER: _ClassVar[int]
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    service_path: str
    entity_id: str
    params: _containers.ScalarMap[str, str]
    def __init__(self, tenant: _Optional[str] = ..., service_path: _Optional[str] = ..., entity_id: _Optional[str] = ..., params: _Optional[_Mapping[str, str]] = ...) -> None: ...

class QueryAnswer(_message.Message):
    __slots__ = ("json", "count")
    JSON_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    json: str
    count: int
    def __init__(self, json: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...
