from broker.wire import client_pb2 as _client_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Hello(_message.Message):
    __slots__ = ("sender", "role")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    sender: str
    role: str
    def __init__(self, sender: _Optional[str] = ..., role: _Optional[str] = ...) -> None: ...

class Updates(_message.Message):
    __slots__ = ("first_seq", "epoch", "entities", "publishers", "sequences", "exit_points", "matchable", "gatherers", "origin", "origin_batch", "incarnation")
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ENTITIES_FIELD_NUMBER: _ClassVar[int]
    PUBLISHERS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    EXIT_POINTS_FIELD_NUMBER: _ClassVar[int]
    MATCHABLE_FIELD_NUMBER: _ClassVar[int]
    GATHERERS_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_BATCH_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    first_seq: int
    epoch: int
    entities: _containers.RepeatedScalarFieldContainer[bytes]
    publishers: _containers.RepeatedScalarFieldContainer[str]
    sequences: _containers.RepeatedScalarFieldContainer[int]
    exit_points: _containers.RepeatedScalarFieldContainer[int]
    matchable: bytes
    gatherers: _containers.RepeatedScalarFieldContainer[int]
    origin: int
    origin_batch: int
    incarnation: int
    def __init__(self, first_seq: _Optional[int] = ..., epoch: _Optional[int] = ..., entities: _Optional[_Iterable[bytes]] = ..., publishers: _Optional[_Iterable[str]] = ..., sequences: _Optional[_Iterable[int]] = ..., exit_points: _Optional[_Iterable[int]] = ..., matchable: _Optional[bytes] = ..., gatherers: _Optional[_Iterable[int]] = ..., origin: _Optional[int] = ..., origin_batch: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("handle", "subscription", "id")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    handle: int
    subscription: bytes
    id: str
    def __init__(self, handle: _Optional[int] = ..., subscription: _Optional[bytes] = ..., id: _Optional[str] = ...) -> None: ...

class Subscriptions(_message.Message):
    __slots__ = ("request", "placements", "replace")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    request: int
    placements: _containers.RepeatedCompositeFieldContainer[Placement]
    replace: bool
    def __init__(self, request: _Optional[int] = ..., placements: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ..., replace: _Optional[bool] = ...) -> None: ...

class Unsubscriptions(_message.Message):
    __slots__ = ("request", "ids")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    request: int
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request: _Optional[int] = ..., ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Marker(_message.Message):
    __slots__ = ("epoch", "start_scale", "switch", "fence", "flush")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_SCALE_FIELD_NUMBER: _ClassVar[int]
    SWITCH_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    FLUSH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    start_scale: StartScale
    switch: Switch
    fence: Fence
    flush: Flush
    def __init__(self, epoch: _Optional[int] = ..., start_scale: _Optional[_Union[StartScale, _Mapping]] = ..., switch: _Optional[_Union[Switch, _Mapping]] = ..., fence: _Optional[_Union[Fence, _Mapping]] = ..., flush: _Optional[_Union[Flush, _Mapping]] = ...) -> None: ...

class Flush(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: int
    def __init__(self, token: _Optional[int] = ...) -> None: ...

class FlushRequest(_message.Message):
    __slots__ = ("sender", "token")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    sender: str
    token: int
    def __init__(self, sender: _Optional[str] = ..., token: _Optional[int] = ...) -> None: ...

class StartScale(_message.Message):
    __slots__ = ("plan",)
    PLAN_FIELD_NUMBER: _ClassVar[int]
    plan: bytes
    def __init__(self, plan: _Optional[bytes] = ...) -> None: ...

class Switch(_message.Message):
    __slots__ = ("access_point",)
    ACCESS_POINT_FIELD_NUMBER: _ClassVar[int]
    access_point: str
    def __init__(self, access_point: _Optional[str] = ...) -> None: ...

class Fence(_message.Message):
    __slots__ = ("connection_point", "token", "matchers", "exit_points", "matcher", "exit_point")
    CONNECTION_POINT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    MATCHERS_FIELD_NUMBER: _ClassVar[int]
    EXIT_POINTS_FIELD_NUMBER: _ClassVar[int]
    MATCHER_FIELD_NUMBER: _ClassVar[int]
    EXIT_POINT_FIELD_NUMBER: _ClassVar[int]
    connection_point: int
    token: int
    matchers: _containers.RepeatedScalarFieldContainer[str]
    exit_points: _containers.RepeatedScalarFieldContainer[int]
    matcher: str
    exit_point: int
    def __init__(self, connection_point: _Optional[int] = ..., token: _Optional[int] = ..., matchers: _Optional[_Iterable[str]] = ..., exit_points: _Optional[_Iterable[int]] = ..., matcher: _Optional[str] = ..., exit_point: _Optional[int] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("hello", "updates", "subscriptions", "unsubscriptions", "marker", "completed")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    UNSUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    MARKER_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    updates: Updates
    subscriptions: Subscriptions
    unsubscriptions: Unsubscriptions
    marker: Marker
    completed: Completed
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., updates: _Optional[_Union[Updates, _Mapping]] = ..., subscriptions: _Optional[_Union[Subscriptions, _Mapping]] = ..., unsubscriptions: _Optional[_Union[Unsubscriptions, _Mapping]] = ..., marker: _Optional[_Union[Marker, _Mapping]] = ..., completed: _Optional[_Union[Completed, _Mapping]] = ...) -> None: ...

class Completed(_message.Message):
    __slots__ = ("batches",)
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, batches: _Optional[_Iterable[int]] = ...) -> None: ...

class RequestAck(_message.Message):
    __slots__ = ("request", "ids", "error", "refused_batches", "replaced")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REFUSED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    request: int
    ids: _containers.RepeatedScalarFieldContainer[str]
    error: _client_pb2.Error
    refused_batches: _containers.RepeatedScalarFieldContainer[int]
    replaced: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request: _Optional[int] = ..., ids: _Optional[_Iterable[str]] = ..., error: _Optional[_Union[_client_pb2.Error, _Mapping]] = ..., refused_batches: _Optional[_Iterable[int]] = ..., replaced: _Optional[_Iterable[int]] = ...) -> None: ...

class Partial(_message.Message):
    __slots__ = ("access_point", "first_seq", "last_seq", "epoch", "items", "entities", "publishers", "sequences", "counts", "handles", "origin", "origin_batch", "completer", "incarnation")
    ACCESS_POINT_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    ENTITIES_FIELD_NUMBER: _ClassVar[int]
    PUBLISHERS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_BATCH_FIELD_NUMBER: _ClassVar[int]
    COMPLETER_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    access_point: str
    first_seq: int
    last_seq: int
    epoch: int
    items: _containers.RepeatedScalarFieldContainer[int]
    entities: _containers.RepeatedScalarFieldContainer[bytes]
    publishers: _containers.RepeatedScalarFieldContainer[str]
    sequences: _containers.RepeatedScalarFieldContainer[int]
    counts: _containers.RepeatedScalarFieldContainer[int]
    handles: bytes
    origin: int
    origin_batch: int
    completer: int
    incarnation: int
    def __init__(self, access_point: _Optional[str] = ..., first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ..., epoch: _Optional[int] = ..., items: _Optional[_Iterable[int]] = ..., entities: _Optional[_Iterable[bytes]] = ..., publishers: _Optional[_Iterable[str]] = ..., sequences: _Optional[_Iterable[int]] = ..., counts: _Optional[_Iterable[int]] = ..., handles: _Optional[bytes] = ..., origin: _Optional[int] = ..., origin_batch: _Optional[int] = ..., completer: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class Gather(_message.Message):
    __slots__ = ("hello", "partial", "marker")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    MARKER_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    partial: Partial
    marker: Marker
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., partial: _Optional[_Union[Partial, _Mapping]] = ..., marker: _Optional[_Union[Marker, _Mapping]] = ...) -> None: ...

class Deliveries(_message.Message):
    __slots__ = ("entities", "publishers", "sequences", "entity_index", "handles", "origin", "origin_batch", "incarnation")
    ENTITIES_FIELD_NUMBER: _ClassVar[int]
    PUBLISHERS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    ENTITY_INDEX_FIELD_NUMBER: _ClassVar[int]
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_BATCH_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    entities: _containers.RepeatedScalarFieldContainer[bytes]
    publishers: _containers.RepeatedScalarFieldContainer[str]
    sequences: _containers.RepeatedScalarFieldContainer[int]
    entity_index: _containers.RepeatedScalarFieldContainer[int]
    handles: bytes
    origin: int
    origin_batch: int
    incarnation: int
    def __init__(self, entities: _Optional[_Iterable[bytes]] = ..., publishers: _Optional[_Iterable[str]] = ..., sequences: _Optional[_Iterable[int]] = ..., entity_index: _Optional[_Iterable[int]] = ..., handles: _Optional[bytes] = ..., origin: _Optional[int] = ..., origin_batch: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class Handoff(_message.Message):
    __slots__ = ("hello", "deliveries", "marker", "completed")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    MARKER_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    deliveries: Deliveries
    marker: Marker
    completed: Completed
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., deliveries: _Optional[_Union[Deliveries, _Mapping]] = ..., marker: _Optional[_Union[Marker, _Mapping]] = ..., completed: _Optional[_Union[Completed, _Mapping]] = ...) -> None: ...

class NotificationBatchOut(_message.Message):
    __slots__ = ("entities", "publishers", "sequences", "entity_index", "handles", "replayed", "incarnation")
    ENTITIES_FIELD_NUMBER: _ClassVar[int]
    PUBLISHERS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    ENTITY_INDEX_FIELD_NUMBER: _ClassVar[int]
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    entities: _containers.RepeatedScalarFieldContainer[bytes]
    publishers: _containers.RepeatedScalarFieldContainer[str]
    sequences: _containers.RepeatedScalarFieldContainer[int]
    entity_index: bytes
    handles: bytes
    replayed: bool
    incarnation: int
    def __init__(self, entities: _Optional[_Iterable[bytes]] = ..., publishers: _Optional[_Iterable[str]] = ..., sequences: _Optional[_Iterable[int]] = ..., entity_index: _Optional[bytes] = ..., handles: _Optional[bytes] = ..., replayed: _Optional[bool] = ..., incarnation: _Optional[int] = ...) -> None: ...

class ReplayRequest(_message.Message):
    __slots__ = ("connection_point", "session", "unreached_only")
    CONNECTION_POINT_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    UNREACHED_ONLY_FIELD_NUMBER: _ClassVar[int]
    connection_point: int
    session: int
    unreached_only: bool
    def __init__(self, connection_point: _Optional[int] = ..., session: _Optional[int] = ..., unreached_only: _Optional[bool] = ...) -> None: ...

class SessionEventOut(_message.Message):
    __slots__ = ("ack", "notifications", "moved")
    ACK_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATIONS_FIELD_NUMBER: _ClassVar[int]
    MOVED_FIELD_NUMBER: _ClassVar[int]
    ack: _client_pb2.SessionAck
    notifications: NotificationBatchOut
    moved: _client_pb2.Moved
    def __init__(self, ack: _Optional[_Union[_client_pb2.SessionAck, _Mapping]] = ..., notifications: _Optional[_Union[NotificationBatchOut, _Mapping]] = ..., moved: _Optional[_Union[_client_pb2.Moved, _Mapping]] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProcessStatus(_message.Message):
    __slots__ = ("name", "role", "address", "pid", "epoch", "subscriptions", "counters", "metrics", "load")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    address: str
    pid: int
    epoch: int
    subscriptions: int
    counters: _containers.ScalarMap[str, float]
    metrics: str
    load: Load
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., address: _Optional[str] = ..., pid: _Optional[int] = ..., epoch: _Optional[int] = ..., subscriptions: _Optional[int] = ..., counters: _Optional[_Mapping[str, float]] = ..., metrics: _Optional[str] = ..., load: _Optional[_Union[Load, _Mapping]] = ...) -> None: ...

class Load(_message.Message):
    __slots__ = ("window", "busy_fraction", "input_rate", "output_rate", "true_rate", "queue_depth", "queue_age", "busy_seconds", "items_in", "items_out", "max_rate", "held_fraction", "items_held")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    BUSY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_RATE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_RATE_FIELD_NUMBER: _ClassVar[int]
    TRUE_RATE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    QUEUE_AGE_FIELD_NUMBER: _ClassVar[int]
    BUSY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_IN_FIELD_NUMBER: _ClassVar[int]
    ITEMS_OUT_FIELD_NUMBER: _ClassVar[int]
    MAX_RATE_FIELD_NUMBER: _ClassVar[int]
    HELD_FRACTION_FIELD_NUMBER: _ClassVar[int]
    ITEMS_HELD_FIELD_NUMBER: _ClassVar[int]
    window: float
    busy_fraction: float
    input_rate: float
    output_rate: float
    true_rate: float
    queue_depth: int
    queue_age: float
    busy_seconds: float
    items_in: int
    items_out: int
    max_rate: float
    held_fraction: float
    items_held: int
    def __init__(self, window: _Optional[float] = ..., busy_fraction: _Optional[float] = ..., input_rate: _Optional[float] = ..., output_rate: _Optional[float] = ..., true_rate: _Optional[float] = ..., queue_depth: _Optional[int] = ..., queue_age: _Optional[float] = ..., busy_seconds: _Optional[float] = ..., items_in: _Optional[int] = ..., items_out: _Optional[int] = ..., max_rate: _Optional[float] = ..., held_fraction: _Optional[float] = ..., items_held: _Optional[int] = ...) -> None: ...

class Part(_message.Message):
    __slots__ = ("sender", "epoch", "data", "plan")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    sender: str
    epoch: int
    data: bytes
    plan: str
    def __init__(self, sender: _Optional[str] = ..., epoch: _Optional[int] = ..., data: _Optional[bytes] = ..., plan: _Optional[str] = ...) -> None: ...

class StoreRequest(_message.Message):
    __slots__ = ("layout", "body")
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    layout: int
    body: bytes
    def __init__(self, layout: _Optional[int] = ..., body: _Optional[bytes] = ...) -> None: ...

class StoreAnswer(_message.Message):
    __slots__ = ("body",)
    BODY_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    def __init__(self, body: _Optional[bytes] = ...) -> None: ...
