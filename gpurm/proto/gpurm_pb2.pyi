from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LinkLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LINK_LEVEL_UNSPECIFIED: _ClassVar[LinkLevel]
    LINK_NVLINK: _ClassVar[LinkLevel]
    LINK_SINGLE: _ClassVar[LinkLevel]
    LINK_MULTIPLE: _ClassVar[LinkLevel]
    LINK_HOSTBRIDGE: _ClassVar[LinkLevel]
    LINK_NODE: _ClassVar[LinkLevel]
    LINK_SYSTEM: _ClassVar[LinkLevel]

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_RUNNING: _ClassVar[NodeState]
    NODE_UNHEALTHY: _ClassVar[NodeState]
    NODE_LOST: _ClassVar[NodeState]
    NODE_DRAINING: _ClassVar[NodeState]
    NODE_DECOMMISSIONED: _ClassVar[NodeState]

class ContainerKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTAINER_KIND_UNSPECIFIED: _ClassVar[ContainerKind]
    CONTAINER_AM: _ClassVar[ContainerKind]
    CONTAINER_LEARNER: _ClassVar[ContainerKind]

class ContainerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTAINER_STATE_UNSPECIFIED: _ClassVar[ContainerState]
    CONTAINER_STARTING: _ClassVar[ContainerState]
    CONTAINER_RUNNING: _ClassVar[ContainerState]
    CONTAINER_EXITED: _ClassVar[ContainerState]
    CONTAINER_FAILED_TO_START: _ClassVar[ContainerState]
    CONTAINER_LOST: _ClassVar[ContainerState]

class TokenPurpose(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOKEN_PURPOSE_UNSPECIFIED: _ClassVar[TokenPurpose]
    TOKEN_CONTAINER: _ClassVar[TokenPurpose]
    TOKEN_READ_LOG: _ClassVar[TokenPurpose]

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_QUEUED: _ClassVar[JobState]
    JOB_ALLOCATING: _ClassVar[JobState]
    JOB_RUNNING: _ClassVar[JobState]
    JOB_SUCCEEDED: _ClassVar[JobState]
    JOB_FAILED: _ClassVar[JobState]
    JOB_KILLED: _ClassVar[JobState]

class FailureKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAILURE_KIND_UNSPECIFIED: _ClassVar[FailureKind]
    FAILURE_NONE: _ClassVar[FailureKind]
    FAILURE_USER: _ClassVar[FailureKind]
    FAILURE_INFRA: _ClassVar[FailureKind]
    FAILURE_PREEMPTED: _ClassVar[FailureKind]
    FAILURE_KILLED: _ClassVar[FailureKind]
    FAILURE_AM: _ClassVar[FailureKind]

class HeartbeatAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEARTBEAT_ACTION_UNSPECIFIED: _ClassVar[HeartbeatAction]
    HEARTBEAT_OK: _ClassVar[HeartbeatAction]
    HEARTBEAT_REREGISTER: _ClassVar[HeartbeatAction]
LINK_LEVEL_UNSPECIFIED: LinkLevel
LINK_NVLINK: LinkLevel
LINK_SINGLE: LinkLevel
LINK_MULTIPLE: LinkLevel
LINK_HOSTBRIDGE: LinkLevel
LINK_NODE: LinkLevel
LINK_SYSTEM: LinkLevel
NODE_STATE_UNSPECIFIED: NodeState
NODE_RUNNING: NodeState
NODE_UNHEALTHY: NodeState
NODE_LOST: NodeState
NODE_DRAINING: NodeState
NODE_DECOMMISSIONED: NodeState
CONTAINER_KIND_UNSPECIFIED: ContainerKind
CONTAINER_AM: ContainerKind
CONTAINER_LEARNER: ContainerKind
CONTAINER_STATE_UNSPECIFIED: ContainerState
CONTAINER_STARTING: ContainerState
CONTAINER_RUNNING: ContainerState
CONTAINER_EXITED: ContainerState
CONTAINER_FAILED_TO_START: ContainerState
CONTAINER_LOST: ContainerState
TOKEN_PURPOSE_UNSPECIFIED: TokenPurpose
TOKEN_CONTAINER: TokenPurpose
TOKEN_READ_LOG: TokenPurpose
JOB_STATE_UNSPECIFIED: JobState
JOB_QUEUED: JobState
JOB_ALLOCATING: JobState
JOB_RUNNING: JobState
JOB_SUCCEEDED: JobState
JOB_FAILED: JobState
JOB_KILLED: JobState
FAILURE_KIND_UNSPECIFIED: FailureKind
FAILURE_NONE: FailureKind
FAILURE_USER: FailureKind
FAILURE_INFRA: FailureKind
FAILURE_PREEMPTED: FailureKind
FAILURE_KILLED: FailureKind
FAILURE_AM: FailureKind
HEARTBEAT_ACTION_UNSPECIFIED: HeartbeatAction
HEARTBEAT_OK: HeartbeatAction
HEARTBEAT_REREGISTER: HeartbeatAction

class GpuLink(_message.Message):
    __slots__ = ("peer", "level", "nvlinks")
    PEER_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    NVLINKS_FIELD_NUMBER: _ClassVar[int]
    peer: int
    level: LinkLevel
    nvlinks: int
    def __init__(self, peer: _Optional[int] = ..., level: _Optional[_Union[LinkLevel, str]] = ..., nvlinks: _Optional[int] = ...) -> None: ...

class GpuInfo(_message.Message):
    __slots__ = ("index", "uuid", "model", "memory_mib", "pci_bus_id", "numa_node", "cpu_affinity", "mig_enabled", "healthy", "health_reason", "links")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    NUMA_NODE_FIELD_NUMBER: _ClassVar[int]
    CPU_AFFINITY_FIELD_NUMBER: _ClassVar[int]
    MIG_ENABLED_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    HEALTH_REASON_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    model: str
    memory_mib: int
    pci_bus_id: str
    numa_node: int
    cpu_affinity: str
    mig_enabled: bool
    healthy: bool
    health_reason: str
    links: _containers.RepeatedCompositeFieldContainer[GpuLink]
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., model: _Optional[str] = ..., memory_mib: _Optional[int] = ..., pci_bus_id: _Optional[str] = ..., numa_node: _Optional[int] = ..., cpu_affinity: _Optional[str] = ..., mig_enabled: _Optional[bool] = ..., healthy: _Optional[bool] = ..., health_reason: _Optional[str] = ..., links: _Optional[_Iterable[_Union[GpuLink, _Mapping]]] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "host", "agent_port", "rack", "ib_domain", "state", "gpus", "gpus_total", "gpus_free", "cpus", "memory_mib", "last_heartbeat_ms", "containers", "assignments", "health_report", "agent_version", "metrics_port", "container_engine", "gpu_passing", "images")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    AGENT_PORT_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    IB_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPUS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GPUS_FREE_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_MS_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_REPORT_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ENGINE_FIELD_NUMBER: _ClassVar[int]
    GPU_PASSING_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    host: str
    agent_port: int
    rack: str
    ib_domain: str
    state: NodeState
    gpus: _containers.RepeatedCompositeFieldContainer[GpuInfo]
    gpus_total: int
    gpus_free: int
    cpus: int
    memory_mib: int
    last_heartbeat_ms: int
    containers: int
    assignments: _containers.RepeatedCompositeFieldContainer[GpuAssignment]
    health_report: str
    agent_version: str
    metrics_port: int
    container_engine: str
    gpu_passing: str
    images: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., host: _Optional[str] = ..., agent_port: _Optional[int] = ..., rack: _Optional[str] = ..., ib_domain: _Optional[str] = ..., state: _Optional[_Union[NodeState, str]] = ..., gpus: _Optional[_Iterable[_Union[GpuInfo, _Mapping]]] = ..., gpus_total: _Optional[int] = ..., gpus_free: _Optional[int] = ..., cpus: _Optional[int] = ..., memory_mib: _Optional[int] = ..., last_heartbeat_ms: _Optional[int] = ..., containers: _Optional[int] = ..., assignments: _Optional[_Iterable[_Union[GpuAssignment, _Mapping]]] = ..., health_report: _Optional[str] = ..., agent_version: _Optional[str] = ..., metrics_port: _Optional[int] = ..., container_engine: _Optional[str] = ..., gpu_passing: _Optional[str] = ..., images: _Optional[_Iterable[str]] = ...) -> None: ...

class GpuAssignment(_message.Message):
    __slots__ = ("gpu_index", "container_id", "job_id", "gpu_share_milli")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_SHARE_MILLI_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    container_id: str
    job_id: str
    gpu_share_milli: int
    def __init__(self, gpu_index: _Optional[int] = ..., container_id: _Optional[str] = ..., job_id: _Optional[str] = ..., gpu_share_milli: _Optional[int] = ...) -> None: ...

class NodeView(_message.Message):
    __slots__ = ("node_id", "rack", "ib_domain", "gpus_total", "free_gpus", "state", "gpus_healthy", "islands", "elastic_gpus", "container_engine", "images", "reserved_gpus", "reserved_for", "reserved_until_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    IB_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    GPUS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    FREE_GPUS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GPUS_HEALTHY_FIELD_NUMBER: _ClassVar[int]
    ISLANDS_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_GPUS_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ENGINE_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_GPUS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_FOR_FIELD_NUMBER: _ClassVar[int]
    RESERVED_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    rack: str
    ib_domain: str
    gpus_total: int
    free_gpus: _containers.RepeatedScalarFieldContainer[int]
    state: NodeState
    gpus_healthy: int
    islands: _containers.RepeatedCompositeFieldContainer[NvlinkIsland]
    elastic_gpus: _containers.RepeatedScalarFieldContainer[int]
    container_engine: str
    images: _containers.RepeatedScalarFieldContainer[str]
    reserved_gpus: _containers.RepeatedScalarFieldContainer[int]
    reserved_for: str
    reserved_until_ms: int
    def __init__(self, node_id: _Optional[str] = ..., rack: _Optional[str] = ..., ib_domain: _Optional[str] = ..., gpus_total: _Optional[int] = ..., free_gpus: _Optional[_Iterable[int]] = ..., state: _Optional[_Union[NodeState, str]] = ..., gpus_healthy: _Optional[int] = ..., islands: _Optional[_Iterable[_Union[NvlinkIsland, _Mapping]]] = ..., elastic_gpus: _Optional[_Iterable[int]] = ..., container_engine: _Optional[str] = ..., images: _Optional[_Iterable[str]] = ..., reserved_gpus: _Optional[_Iterable[int]] = ..., reserved_for: _Optional[str] = ..., reserved_until_ms: _Optional[int] = ...) -> None: ...

class NvlinkIsland(_message.Message):
    __slots__ = ("gpus",)
    GPUS_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, gpus: _Optional[_Iterable[int]] = ...) -> None: ...

class ClusterView(_message.Message):
    __slots__ = ("version", "time_ms", "nodes", "base_version", "delta", "epoch")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    version: int
    time_ms: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeView]
    base_version: int
    delta: bool
    epoch: int
    def __init__(self, version: _Optional[int] = ..., time_ms: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeView, _Mapping]]] = ..., base_version: _Optional[int] = ..., delta: _Optional[bool] = ..., epoch: _Optional[int] = ...) -> None: ...

class ContainerStatus(_message.Message):
    __slots__ = ("container_id", "job_id", "kind", "state", "pid", "exit_code", "signal", "stopped", "diagnostics", "start_ms", "end_ms", "gpu_indices", "node_id", "infra_failure", "user_error")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSTICS_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INFRA_FAILURE_FIELD_NUMBER: _ClassVar[int]
    USER_ERROR_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    job_id: str
    kind: ContainerKind
    state: ContainerState
    pid: int
    exit_code: int
    signal: int
    stopped: bool
    diagnostics: str
    start_ms: int
    end_ms: int
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    node_id: str
    infra_failure: bool
    user_error: bool
    def __init__(self, container_id: _Optional[str] = ..., job_id: _Optional[str] = ..., kind: _Optional[_Union[ContainerKind, str]] = ..., state: _Optional[_Union[ContainerState, str]] = ..., pid: _Optional[int] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., stopped: _Optional[bool] = ..., diagnostics: _Optional[str] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., node_id: _Optional[str] = ..., infra_failure: _Optional[bool] = ..., user_error: _Optional[bool] = ...) -> None: ...

class ContainerTokenPayload(_message.Message):
    __slots__ = ("container_id", "job_id", "node_id", "gpu_indices", "kind", "user", "expiry_ms", "attempt", "cpus", "memory_mib", "purpose", "rightsize", "gpu_share_milli")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    EXPIRY_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    RIGHTSIZE_FIELD_NUMBER: _ClassVar[int]
    GPU_SHARE_MILLI_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    job_id: str
    node_id: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    kind: ContainerKind
    user: str
    expiry_ms: int
    attempt: int
    cpus: int
    memory_mib: int
    purpose: TokenPurpose
    rightsize: bool
    gpu_share_milli: int
    def __init__(self, container_id: _Optional[str] = ..., job_id: _Optional[str] = ..., node_id: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., kind: _Optional[_Union[ContainerKind, str]] = ..., user: _Optional[str] = ..., expiry_ms: _Optional[int] = ..., attempt: _Optional[int] = ..., cpus: _Optional[int] = ..., memory_mib: _Optional[int] = ..., purpose: _Optional[_Union[TokenPurpose, str]] = ..., rightsize: _Optional[bool] = ..., gpu_share_milli: _Optional[int] = ...) -> None: ...

class ContainerToken(_message.Message):
    __slots__ = ("payload", "signature", "key_id")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    signature: bytes
    key_id: int
    def __init__(self, payload: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., key_id: _Optional[int] = ...) -> None: ...

class LaunchContext(_message.Message):
    __slots__ = ("argv", "env", "workdir", "image", "mounts", "shm_size_mib")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ARGV_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    SHM_SIZE_MIB_FIELD_NUMBER: _ClassVar[int]
    argv: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    workdir: str
    image: str
    mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    shm_size_mib: int
    def __init__(self, argv: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., workdir: _Optional[str] = ..., image: _Optional[str] = ..., mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., shm_size_mib: _Optional[int] = ...) -> None: ...

class Mount(_message.Message):
    __slots__ = ("source", "target", "writable")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_FIELD_NUMBER: _ClassVar[int]
    source: str
    target: str
    writable: bool
    def __init__(self, source: _Optional[str] = ..., target: _Optional[str] = ..., writable: _Optional[bool] = ...) -> None: ...

class LocalitySpec(_message.Message):
    __slots__ = ("timeout_ms", "backoff_base_ms", "backoff_max_ms", "start_level", "mode")
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_BASE_MS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MAX_MS_FIELD_NUMBER: _ClassVar[int]
    START_LEVEL_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    timeout_ms: int
    backoff_base_ms: int
    backoff_max_ms: int
    start_level: str
    mode: str
    def __init__(self, timeout_ms: _Optional[int] = ..., backoff_base_ms: _Optional[int] = ..., backoff_max_ms: _Optional[int] = ..., start_level: _Optional[str] = ..., mode: _Optional[str] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "queue", "gpus", "command", "workdir", "env", "max_retries", "locality", "placement", "max_gpus", "gpu_share_milli", "image", "mounts", "shm_size_mib")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    LOCALITY_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    MAX_GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_SHARE_MILLI_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    SHM_SIZE_MIB_FIELD_NUMBER: _ClassVar[int]
    name: str
    queue: str
    gpus: int
    command: _containers.RepeatedScalarFieldContainer[str]
    workdir: str
    env: _containers.ScalarMap[str, str]
    max_retries: int
    locality: LocalitySpec
    placement: str
    max_gpus: int
    gpu_share_milli: int
    image: str
    mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    shm_size_mib: int
    def __init__(self, name: _Optional[str] = ..., queue: _Optional[str] = ..., gpus: _Optional[int] = ..., command: _Optional[_Iterable[str]] = ..., workdir: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., max_retries: _Optional[int] = ..., locality: _Optional[_Union[LocalitySpec, _Mapping]] = ..., placement: _Optional[str] = ..., max_gpus: _Optional[int] = ..., gpu_share_milli: _Optional[int] = ..., image: _Optional[str] = ..., mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., shm_size_mib: _Optional[int] = ...) -> None: ...

class Learner(_message.Message):
    __slots__ = ("rank", "node_id", "host", "gpu_indices", "container_id", "state", "exit_code", "signal", "pid", "preemptible", "usage", "rightsize")
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    RIGHTSIZE_FIELD_NUMBER: _ClassVar[int]
    rank: int
    node_id: str
    host: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    container_id: str
    state: ContainerState
    exit_code: int
    signal: int
    pid: int
    preemptible: bool
    usage: str
    rightsize: str
    def __init__(self, rank: _Optional[int] = ..., node_id: _Optional[str] = ..., host: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., container_id: _Optional[str] = ..., state: _Optional[_Union[ContainerState, str]] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., pid: _Optional[int] = ..., preemptible: _Optional[bool] = ..., usage: _Optional[str] = ..., rightsize: _Optional[str] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("attempt", "state", "start_ms", "end_ms", "learners", "failure", "cause", "exit_code", "counts_as_failure", "level", "am_attempt")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    COUNTS_AS_FAILURE_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    AM_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    state: JobState
    start_ms: int
    end_ms: int
    learners: _containers.RepeatedCompositeFieldContainer[Learner]
    failure: FailureKind
    cause: str
    exit_code: int
    counts_as_failure: bool
    level: str
    am_attempt: int
    def __init__(self, attempt: _Optional[int] = ..., state: _Optional[_Union[JobState, str]] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., learners: _Optional[_Iterable[_Union[Learner, _Mapping]]] = ..., failure: _Optional[_Union[FailureKind, str]] = ..., cause: _Optional[str] = ..., exit_code: _Optional[int] = ..., counts_as_failure: _Optional[bool] = ..., level: _Optional[str] = ..., am_attempt: _Optional[int] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "spec", "user", "queue", "state", "submit_ms", "start_ms", "finish_ms", "attempts", "diagnostics", "exit_code", "am_attempt", "am_node", "gpus_held", "preemptible", "preemptions", "failures", "live_containers", "waiting_reason", "attained_gpu_s", "target_gpus", "forecast")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_MS_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    FINISH_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSTICS_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    AM_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    AM_NODE_FIELD_NUMBER: _ClassVar[int]
    GPUS_HELD_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    LIVE_CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REASON_FIELD_NUMBER: _ClassVar[int]
    ATTAINED_GPU_S_FIELD_NUMBER: _ClassVar[int]
    TARGET_GPUS_FIELD_NUMBER: _ClassVar[int]
    FORECAST_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    spec: JobSpec
    user: str
    queue: str
    state: JobState
    submit_ms: int
    start_ms: int
    finish_ms: int
    attempts: _containers.RepeatedCompositeFieldContainer[Attempt]
    diagnostics: str
    exit_code: int
    am_attempt: int
    am_node: str
    gpus_held: int
    preemptible: bool
    preemptions: int
    failures: int
    live_containers: int
    waiting_reason: str
    attained_gpu_s: float
    target_gpus: int
    forecast: StartForecast
    def __init__(self, job_id: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., user: _Optional[str] = ..., queue: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., submit_ms: _Optional[int] = ..., start_ms: _Optional[int] = ..., finish_ms: _Optional[int] = ..., attempts: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ..., diagnostics: _Optional[str] = ..., exit_code: _Optional[int] = ..., am_attempt: _Optional[int] = ..., am_node: _Optional[str] = ..., gpus_held: _Optional[int] = ..., preemptible: _Optional[bool] = ..., preemptions: _Optional[int] = ..., failures: _Optional[int] = ..., live_containers: _Optional[int] = ..., waiting_reason: _Optional[str] = ..., attained_gpu_s: _Optional[float] = ..., target_gpus: _Optional[int] = ..., forecast: _Optional[_Union[StartForecast, _Mapping]] = ...) -> None: ...

class StartForecast(_message.Message):
    __slots__ = ("made_ms", "earliest_ms", "likely_ms", "latest_ms", "horizon_ms")
    MADE_MS_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_MS_FIELD_NUMBER: _ClassVar[int]
    LIKELY_MS_FIELD_NUMBER: _ClassVar[int]
    LATEST_MS_FIELD_NUMBER: _ClassVar[int]
    HORIZON_MS_FIELD_NUMBER: _ClassVar[int]
    made_ms: int
    earliest_ms: int
    likely_ms: int
    latest_ms: int
    horizon_ms: int
    def __init__(self, made_ms: _Optional[int] = ..., earliest_ms: _Optional[int] = ..., likely_ms: _Optional[int] = ..., latest_ms: _Optional[int] = ..., horizon_ms: _Optional[int] = ...) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("node_id", "host", "agent_port", "rack", "ib_domain", "gpus", "cpus", "memory_mib", "containers", "agent_version", "agent_instance", "healthy", "health_report", "join_time_ms", "join_proof", "metrics_port", "container_engine", "gpu_passing", "images", "follows_interval")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    AGENT_PORT_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    IB_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    HEALTH_REPORT_FIELD_NUMBER: _ClassVar[int]
    JOIN_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    JOIN_PROOF_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ENGINE_FIELD_NUMBER: _ClassVar[int]
    GPU_PASSING_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    FOLLOWS_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    host: str
    agent_port: int
    rack: str
    ib_domain: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuInfo]
    cpus: int
    memory_mib: int
    containers: _containers.RepeatedCompositeFieldContainer[ContainerStatus]
    agent_version: str
    agent_instance: str
    healthy: bool
    health_report: str
    join_time_ms: int
    join_proof: bytes
    metrics_port: int
    container_engine: str
    gpu_passing: str
    images: _containers.RepeatedScalarFieldContainer[str]
    follows_interval: bool
    def __init__(self, node_id: _Optional[str] = ..., host: _Optional[str] = ..., agent_port: _Optional[int] = ..., rack: _Optional[str] = ..., ib_domain: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuInfo, _Mapping]]] = ..., cpus: _Optional[int] = ..., memory_mib: _Optional[int] = ..., containers: _Optional[_Iterable[_Union[ContainerStatus, _Mapping]]] = ..., agent_version: _Optional[str] = ..., agent_instance: _Optional[str] = ..., healthy: _Optional[bool] = ..., health_report: _Optional[str] = ..., join_time_ms: _Optional[int] = ..., join_proof: _Optional[bytes] = ..., metrics_port: _Optional[int] = ..., container_engine: _Optional[str] = ..., gpu_passing: _Optional[str] = ..., images: _Optional[_Iterable[str]] = ..., follows_interval: _Optional[bool] = ...) -> None: ...

class RegisterNodeResponse(_message.Message):
    __slots__ = ("session", "heartbeat_interval_ms", "token_key", "token_key_id", "mqtt_url", "stop_containers", "mqtt_username", "mqtt_password", "epoch", "resync_spread_ms", "lease_ms", "fence_grace_ms")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    MQTT_URL_FIELD_NUMBER: _ClassVar[int]
    STOP_CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    MQTT_USERNAME_FIELD_NUMBER: _ClassVar[int]
    MQTT_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RESYNC_SPREAD_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    FENCE_GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    session: str
    heartbeat_interval_ms: int
    token_key: bytes
    token_key_id: int
    mqtt_url: str
    stop_containers: _containers.RepeatedScalarFieldContainer[str]
    mqtt_username: str
    mqtt_password: str
    epoch: int
    resync_spread_ms: int
    lease_ms: int
    fence_grace_ms: int
    def __init__(self, session: _Optional[str] = ..., heartbeat_interval_ms: _Optional[int] = ..., token_key: _Optional[bytes] = ..., token_key_id: _Optional[int] = ..., mqtt_url: _Optional[str] = ..., stop_containers: _Optional[_Iterable[str]] = ..., mqtt_username: _Optional[str] = ..., mqtt_password: _Optional[str] = ..., epoch: _Optional[int] = ..., resync_spread_ms: _Optional[int] = ..., lease_ms: _Optional[int] = ..., fence_grace_ms: _Optional[int] = ...) -> None: ...

class NodeHeartbeat(_message.Message):
    __slots__ = ("node_id", "session", "seq", "containers", "gpu_health", "healthy", "health_report", "usage", "telemetry", "images_added", "images_removed")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    GPU_HEALTH_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    HEALTH_REPORT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    IMAGES_ADDED_FIELD_NUMBER: _ClassVar[int]
    IMAGES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session: str
    seq: int
    containers: _containers.RepeatedCompositeFieldContainer[ContainerStatus]
    gpu_health: _containers.RepeatedCompositeFieldContainer[GpuInfo]
    healthy: bool
    health_report: str
    usage: _containers.RepeatedCompositeFieldContainer[ContainerUsage]
    telemetry: bytes
    images_added: _containers.RepeatedScalarFieldContainer[str]
    images_removed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., session: _Optional[str] = ..., seq: _Optional[int] = ..., containers: _Optional[_Iterable[_Union[ContainerStatus, _Mapping]]] = ..., gpu_health: _Optional[_Iterable[_Union[GpuInfo, _Mapping]]] = ..., healthy: _Optional[bool] = ..., health_report: _Optional[str] = ..., usage: _Optional[_Iterable[_Union[ContainerUsage, _Mapping]]] = ..., telemetry: _Optional[bytes] = ..., images_added: _Optional[_Iterable[str]] = ..., images_removed: _Optional[_Iterable[str]] = ...) -> None: ...

class ContainerUsage(_message.Message):
    __slots__ = ("container_id", "summary", "rightsize")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    RIGHTSIZE_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    summary: str
    rightsize: str
    def __init__(self, container_id: _Optional[str] = ..., summary: _Optional[str] = ..., rightsize: _Optional[str] = ...) -> None: ...

class StopOrder(_message.Message):
    __slots__ = ("container_id", "grace_ms", "reason")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    grace_ms: int
    reason: str
    def __init__(self, container_id: _Optional[str] = ..., grace_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("ack_seq", "action", "stop", "heartbeat_interval_ms", "lease_ms", "fence_grace_ms")
    ACK_SEQ_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    FENCE_GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    ack_seq: int
    action: HeartbeatAction
    stop: _containers.RepeatedCompositeFieldContainer[StopOrder]
    heartbeat_interval_ms: int
    lease_ms: int
    fence_grace_ms: int
    def __init__(self, ack_seq: _Optional[int] = ..., action: _Optional[_Union[HeartbeatAction, str]] = ..., stop: _Optional[_Iterable[_Union[StopOrder, _Mapping]]] = ..., heartbeat_interval_ms: _Optional[int] = ..., lease_ms: _Optional[int] = ..., fence_grace_ms: _Optional[int] = ...) -> None: ...

class RegisterAMRequest(_message.Message):
    __slots__ = ("job_id", "am_attempt", "host")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    AM_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    am_attempt: int
    host: str
    def __init__(self, job_id: _Optional[str] = ..., am_attempt: _Optional[int] = ..., host: _Optional[str] = ...) -> None: ...

class ContainerGrant(_message.Message):
    __slots__ = ("container_id", "node_id", "host", "agent_port", "gpu_indices", "token", "preemptible", "rack", "attempt", "gpu_share_milli")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    AGENT_PORT_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GPU_SHARE_MILLI_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    node_id: str
    host: str
    agent_port: int
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    token: ContainerToken
    preemptible: bool
    rack: str
    attempt: int
    gpu_share_milli: int
    def __init__(self, container_id: _Optional[str] = ..., node_id: _Optional[str] = ..., host: _Optional[str] = ..., agent_port: _Optional[int] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., token: _Optional[_Union[ContainerToken, _Mapping]] = ..., preemptible: _Optional[bool] = ..., rack: _Optional[str] = ..., attempt: _Optional[int] = ..., gpu_share_milli: _Optional[int] = ...) -> None: ...

class RegisterAMResponse(_message.Message):
    __slots__ = ("job", "held", "held_status", "mqtt_url", "allocate_interval_ms", "view", "mqtt_username", "mqtt_password", "am_token")
    JOB_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    HELD_STATUS_FIELD_NUMBER: _ClassVar[int]
    MQTT_URL_FIELD_NUMBER: _ClassVar[int]
    ALLOCATE_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    MQTT_USERNAME_FIELD_NUMBER: _ClassVar[int]
    MQTT_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    AM_TOKEN_FIELD_NUMBER: _ClassVar[int]
    job: Job
    held: _containers.RepeatedCompositeFieldContainer[ContainerGrant]
    held_status: _containers.RepeatedCompositeFieldContainer[ContainerStatus]
    mqtt_url: str
    allocate_interval_ms: int
    view: ClusterView
    mqtt_username: str
    mqtt_password: str
    am_token: str
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., held: _Optional[_Iterable[_Union[ContainerGrant, _Mapping]]] = ..., held_status: _Optional[_Iterable[_Union[ContainerStatus, _Mapping]]] = ..., mqtt_url: _Optional[str] = ..., allocate_interval_ms: _Optional[int] = ..., view: _Optional[_Union[ClusterView, _Mapping]] = ..., mqtt_username: _Optional[str] = ..., mqtt_password: _Optional[str] = ..., am_token: _Optional[str] = ...) -> None: ...

class ResourceAsk(_message.Message):
    __slots__ = ("node_id", "rack", "gpus", "count", "gpu_indices", "elastic", "gpu_share_milli")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_FIELD_NUMBER: _ClassVar[int]
    GPU_SHARE_MILLI_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    rack: str
    gpus: int
    count: int
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    elastic: bool
    gpu_share_milli: int
    def __init__(self, node_id: _Optional[str] = ..., rack: _Optional[str] = ..., gpus: _Optional[int] = ..., count: _Optional[int] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., elastic: _Optional[bool] = ..., gpu_share_milli: _Optional[int] = ...) -> None: ...

class AttemptReport(_message.Message):
    __slots__ = ("attempt", "state", "learners", "waiting_reason", "level", "failure", "cause", "exit_code", "counts_as_failure", "start_ms", "end_ms")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REASON_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    COUNTS_AS_FAILURE_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    state: JobState
    learners: _containers.RepeatedCompositeFieldContainer[Learner]
    waiting_reason: str
    level: str
    failure: FailureKind
    cause: str
    exit_code: int
    counts_as_failure: bool
    start_ms: int
    end_ms: int
    def __init__(self, attempt: _Optional[int] = ..., state: _Optional[_Union[JobState, str]] = ..., learners: _Optional[_Iterable[_Union[Learner, _Mapping]]] = ..., waiting_reason: _Optional[str] = ..., level: _Optional[str] = ..., failure: _Optional[_Union[FailureKind, str]] = ..., cause: _Optional[str] = ..., exit_code: _Optional[int] = ..., counts_as_failure: _Optional[bool] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ...) -> None: ...

class AllocateRequest(_message.Message):
    __slots__ = ("job_id", "am_attempt", "response_id", "asks", "releases", "attempts")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    AM_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    ASKS_FIELD_NUMBER: _ClassVar[int]
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    am_attempt: int
    response_id: int
    asks: _containers.RepeatedCompositeFieldContainer[ResourceAsk]
    releases: _containers.RepeatedScalarFieldContainer[str]
    attempts: _containers.RepeatedCompositeFieldContainer[AttemptReport]
    def __init__(self, job_id: _Optional[str] = ..., am_attempt: _Optional[int] = ..., response_id: _Optional[int] = ..., asks: _Optional[_Iterable[_Union[ResourceAsk, _Mapping]]] = ..., releases: _Optional[_Iterable[str]] = ..., attempts: _Optional[_Iterable[_Union[AttemptReport, _Mapping]]] = ...) -> None: ...

class PreemptionNotice(_message.Message):
    __slots__ = ("container_ids", "deadline_ms", "reason")
    CONTAINER_IDS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    container_ids: _containers.RepeatedScalarFieldContainer[str]
    deadline_ms: int
    reason: str
    def __init__(self, container_ids: _Optional[_Iterable[str]] = ..., deadline_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class AllocateResponse(_message.Message):
    __slots__ = ("response_id", "grants", "completed", "preemption", "kill_requested", "cluster_gpus", "view", "preemptible_containers", "renewed", "am_token", "target_gpus", "steady_interval_ms", "plan_now", "expected_run_ms")
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_FIELD_NUMBER: _ClassVar[int]
    KILL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_GPUS_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    RENEWED_FIELD_NUMBER: _ClassVar[int]
    AM_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TARGET_GPUS_FIELD_NUMBER: _ClassVar[int]
    STEADY_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    PLAN_NOW_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_RUN_MS_FIELD_NUMBER: _ClassVar[int]
    response_id: int
    grants: _containers.RepeatedCompositeFieldContainer[ContainerGrant]
    completed: _containers.RepeatedCompositeFieldContainer[ContainerStatus]
    preemption: PreemptionNotice
    kill_requested: bool
    cluster_gpus: int
    view: ClusterView
    preemptible_containers: _containers.RepeatedScalarFieldContainer[str]
    renewed: _containers.RepeatedCompositeFieldContainer[ContainerGrant]
    am_token: str
    target_gpus: int
    steady_interval_ms: int
    plan_now: bool
    expected_run_ms: int
    def __init__(self, response_id: _Optional[int] = ..., grants: _Optional[_Iterable[_Union[ContainerGrant, _Mapping]]] = ..., completed: _Optional[_Iterable[_Union[ContainerStatus, _Mapping]]] = ..., preemption: _Optional[_Union[PreemptionNotice, _Mapping]] = ..., kill_requested: _Optional[bool] = ..., cluster_gpus: _Optional[int] = ..., view: _Optional[_Union[ClusterView, _Mapping]] = ..., preemptible_containers: _Optional[_Iterable[str]] = ..., renewed: _Optional[_Iterable[_Union[ContainerGrant, _Mapping]]] = ..., am_token: _Optional[str] = ..., target_gpus: _Optional[int] = ..., steady_interval_ms: _Optional[int] = ..., plan_now: _Optional[bool] = ..., expected_run_ms: _Optional[int] = ...) -> None: ...

class FinishAMRequest(_message.Message):
    __slots__ = ("job_id", "am_attempt", "final_state", "diagnostics", "exit_code", "attempts")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    AM_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FINAL_STATE_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSTICS_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    am_attempt: int
    final_state: JobState
    diagnostics: str
    exit_code: int
    attempts: _containers.RepeatedCompositeFieldContainer[AttemptReport]
    def __init__(self, job_id: _Optional[str] = ..., am_attempt: _Optional[int] = ..., final_state: _Optional[_Union[JobState, str]] = ..., diagnostics: _Optional[str] = ..., exit_code: _Optional[int] = ..., attempts: _Optional[_Iterable[_Union[AttemptReport, _Mapping]]] = ...) -> None: ...

class FinishAMResponse(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("spec", "submit_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_ID_FIELD_NUMBER: _ClassVar[int]
    spec: JobSpec
    submit_id: str
    def __init__(self, spec: _Optional[_Union[JobSpec, _Mapping]] = ..., submit_id: _Optional[str] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job_id", "queue")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    queue: str
    def __init__(self, job_id: _Optional[str] = ..., queue: _Optional[str] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("states", "queue", "user", "limit", "page_size", "page_token", "name", "json")
    STATES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[JobState]
    queue: str
    user: str
    limit: int
    page_size: int
    page_token: str
    name: str
    json: bool
    def __init__(self, states: _Optional[_Iterable[_Union[JobState, str]]] = ..., queue: _Optional[str] = ..., user: _Optional[str] = ..., limit: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., name: _Optional[str] = ..., json: _Optional[bool] = ...) -> None: ...

class AccountingRequest(_message.Message):
    __slots__ = ("by", "since_ms", "until_ms", "users", "queues")
    BY_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    USERS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    by: _containers.RepeatedScalarFieldContainer[str]
    since_ms: int
    until_ms: int
    users: _containers.RepeatedScalarFieldContainer[str]
    queues: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, by: _Optional[_Iterable[str]] = ..., since_ms: _Optional[int] = ..., until_ms: _Optional[int] = ..., users: _Optional[_Iterable[str]] = ..., queues: _Optional[_Iterable[str]] = ...) -> None: ...

class AccountingRow(_message.Message):
    __slots__ = ("key", "jobs", "succeeded", "failed", "killed", "preempted", "preemptions", "gpu_seconds", "waited", "wait_total_s", "wait_max_s")
    class KeyEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    KILLED_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WAITED_FIELD_NUMBER: _ClassVar[int]
    WAIT_TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    WAIT_MAX_S_FIELD_NUMBER: _ClassVar[int]
    key: _containers.ScalarMap[str, str]
    jobs: int
    succeeded: int
    failed: int
    killed: int
    preempted: int
    preemptions: int
    gpu_seconds: float
    waited: int
    wait_total_s: float
    wait_max_s: float
    def __init__(self, key: _Optional[_Mapping[str, str]] = ..., jobs: _Optional[int] = ..., succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., killed: _Optional[int] = ..., preempted: _Optional[int] = ..., preemptions: _Optional[int] = ..., gpu_seconds: _Optional[float] = ..., waited: _Optional[int] = ..., wait_total_s: _Optional[float] = ..., wait_max_s: _Optional[float] = ...) -> None: ...

class AccountingResponse(_message.Message):
    __slots__ = ("rows", "total", "since_ms", "until_ms")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[AccountingRow]
    total: AccountingRow
    since_ms: int
    until_ms: int
    def __init__(self, rows: _Optional[_Iterable[_Union[AccountingRow, _Mapping]]] = ..., total: _Optional[_Union[AccountingRow, _Mapping]] = ..., since_ms: _Optional[int] = ..., until_ms: _Optional[int] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token", "total", "json_items", "json_count")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    JSON_ITEMS_FIELD_NUMBER: _ClassVar[int]
    JSON_COUNT_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    total: int
    json_items: bytes
    json_count: int
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., total: _Optional[int] = ..., json_items: _Optional[bytes] = ..., json_count: _Optional[int] = ...) -> None: ...

class KillJobRequest(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class KillJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class ScaleJobRequest(_message.Message):
    __slots__ = ("job_id", "gpus")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    gpus: int
    def __init__(self, job_id: _Optional[str] = ..., gpus: _Optional[int] = ...) -> None: ...

class ScaleJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class GetLogsRequest(_message.Message):
    __slots__ = ("job_id", "rank", "attempt", "offset", "max_bytes", "am")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    AM_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    attempt: int
    offset: int
    max_bytes: int
    am: bool
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., attempt: _Optional[int] = ..., offset: _Optional[int] = ..., max_bytes: _Optional[int] = ..., am: _Optional[bool] = ...) -> None: ...

class GetLogsResponse(_message.Message):
    __slots__ = ("data", "next_offset", "size", "container_id", "node_id", "container_done")
    DATA_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_DONE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    next_offset: int
    size: int
    container_id: str
    node_id: str
    container_done: bool
    def __init__(self, data: _Optional[bytes] = ..., next_offset: _Optional[int] = ..., size: _Optional[int] = ..., container_id: _Optional[str] = ..., node_id: _Optional[str] = ..., container_done: _Optional[bool] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "states", "rack", "gpu_model", "min_free_gpus", "name", "brief")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    MIN_FREE_GPUS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    BRIEF_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    states: _containers.RepeatedScalarFieldContainer[NodeState]
    rack: str
    gpu_model: str
    min_free_gpus: int
    name: str
    brief: bool
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., states: _Optional[_Iterable[_Union[NodeState, str]]] = ..., rack: _Optional[str] = ..., gpu_model: _Optional[str] = ..., min_free_gpus: _Optional[int] = ..., name: _Optional[str] = ..., brief: _Optional[bool] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes", "next_page_token", "total")
    NODES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    next_page_token: str
    total: int
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., total: _Optional[int] = ...) -> None: ...

class QueueInfo(_message.Message):
    __slots__ = ("path", "weight", "min_gpus", "max_gpus", "steady_share", "instantaneous_share", "used_gpus", "pending_gpus", "running_jobs", "queued_jobs", "leaf", "preemptible", "policy", "max_running_jobs", "starved_since_ms", "used", "pending", "below_guarantee_s")
    PATH_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    MIN_GPUS_FIELD_NUMBER: _ClassVar[int]
    MAX_GPUS_FIELD_NUMBER: _ClassVar[int]
    STEADY_SHARE_FIELD_NUMBER: _ClassVar[int]
    INSTANTANEOUS_SHARE_FIELD_NUMBER: _ClassVar[int]
    USED_GPUS_FIELD_NUMBER: _ClassVar[int]
    PENDING_GPUS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_JOBS_FIELD_NUMBER: _ClassVar[int]
    LEAF_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    STARVED_SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    BELOW_GUARANTEE_S_FIELD_NUMBER: _ClassVar[int]
    path: str
    weight: float
    min_gpus: int
    max_gpus: int
    steady_share: int
    instantaneous_share: int
    used_gpus: int
    pending_gpus: int
    running_jobs: int
    queued_jobs: int
    leaf: bool
    preemptible: bool
    policy: str
    max_running_jobs: int
    starved_since_ms: int
    used: float
    pending: float
    below_guarantee_s: float
    def __init__(self, path: _Optional[str] = ..., weight: _Optional[float] = ..., min_gpus: _Optional[int] = ..., max_gpus: _Optional[int] = ..., steady_share: _Optional[int] = ..., instantaneous_share: _Optional[int] = ..., used_gpus: _Optional[int] = ..., pending_gpus: _Optional[int] = ..., running_jobs: _Optional[int] = ..., queued_jobs: _Optional[int] = ..., leaf: _Optional[bool] = ..., preemptible: _Optional[bool] = ..., policy: _Optional[str] = ..., max_running_jobs: _Optional[int] = ..., starved_since_ms: _Optional[int] = ..., used: _Optional[float] = ..., pending: _Optional[float] = ..., below_guarantee_s: _Optional[float] = ...) -> None: ...

class SizeClassQueueing(_message.Message):
    __slots__ = ("size", "started", "mean_s", "p99_s", "waiting", "longest_wait_s")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    MEAN_S_FIELD_NUMBER: _ClassVar[int]
    P99_S_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    LONGEST_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    size: str
    started: int
    mean_s: float
    p99_s: float
    waiting: int
    longest_wait_s: float
    def __init__(self, size: _Optional[str] = ..., started: _Optional[int] = ..., mean_s: _Optional[float] = ..., p99_s: _Optional[float] = ..., waiting: _Optional[int] = ..., longest_wait_s: _Optional[float] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues", "capacity", "next_page_token", "total", "by_size", "borrowing", "borrowing_preemptions")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    BY_SIZE_FIELD_NUMBER: _ClassVar[int]
    BORROWING_FIELD_NUMBER: _ClassVar[int]
    BORROWING_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueInfo]
    capacity: int
    next_page_token: str
    total: int
    by_size: _containers.RepeatedCompositeFieldContainer[SizeClassQueueing]
    borrowing: str
    borrowing_preemptions: int
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueInfo, _Mapping]]] = ..., capacity: _Optional[int] = ..., next_page_token: _Optional[str] = ..., total: _Optional[int] = ..., by_size: _Optional[_Iterable[_Union[SizeClassQueueing, _Mapping]]] = ..., borrowing: _Optional[str] = ..., borrowing_preemptions: _Optional[int] = ...) -> None: ...

class ClusterInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterInfo(_message.Message):
    __slots__ = ("mqtt_url", "version", "gpus_total", "nodes", "started_ms", "insecure", "caller", "caller_admin", "epoch", "store_error", "warnings", "mqtt_username", "mqtt_password", "http_url")
    MQTT_URL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    STARTED_MS_FIELD_NUMBER: _ClassVar[int]
    INSECURE_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    CALLER_ADMIN_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STORE_ERROR_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    MQTT_USERNAME_FIELD_NUMBER: _ClassVar[int]
    MQTT_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    HTTP_URL_FIELD_NUMBER: _ClassVar[int]
    mqtt_url: str
    version: str
    gpus_total: int
    nodes: int
    started_ms: int
    insecure: bool
    caller: str
    caller_admin: bool
    epoch: int
    store_error: str
    warnings: _containers.RepeatedScalarFieldContainer[str]
    mqtt_username: str
    mqtt_password: str
    http_url: str
    def __init__(self, mqtt_url: _Optional[str] = ..., version: _Optional[str] = ..., gpus_total: _Optional[int] = ..., nodes: _Optional[int] = ..., started_ms: _Optional[int] = ..., insecure: _Optional[bool] = ..., caller: _Optional[str] = ..., caller_admin: _Optional[bool] = ..., epoch: _Optional[int] = ..., store_error: _Optional[str] = ..., warnings: _Optional[_Iterable[str]] = ..., mqtt_username: _Optional[str] = ..., mqtt_password: _Optional[str] = ..., http_url: _Optional[str] = ...) -> None: ...

class GetClusterViewRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RefreshQueuesRequest(_message.Message):
    __slots__ = ("yaml",)
    YAML_FIELD_NUMBER: _ClassVar[int]
    yaml: str
    def __init__(self, yaml: _Optional[str] = ...) -> None: ...

class RefreshQueuesResponse(_message.Message):
    __slots__ = ("applied", "errors", "queues", "warnings")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    errors: _containers.RepeatedScalarFieldContainer[str]
    queues: _containers.RepeatedCompositeFieldContainer[QueueInfo]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, applied: _Optional[bool] = ..., errors: _Optional[_Iterable[str]] = ..., queues: _Optional[_Iterable[_Union[QueueInfo, _Mapping]]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node_id", "undrain")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    UNDRAIN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    undrain: bool
    def __init__(self, node_id: _Optional[str] = ..., undrain: _Optional[bool] = ...) -> None: ...

class DrainNodeResponse(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: NodeInfo
    def __init__(self, node: _Optional[_Union[NodeInfo, _Mapping]] = ...) -> None: ...

class StartContainerRequest(_message.Message):
    __slots__ = ("token", "launch")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    token: ContainerToken
    launch: LaunchContext
    def __init__(self, token: _Optional[_Union[ContainerToken, _Mapping]] = ..., launch: _Optional[_Union[LaunchContext, _Mapping]] = ...) -> None: ...

class StartContainerResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: ContainerStatus
    def __init__(self, status: _Optional[_Union[ContainerStatus, _Mapping]] = ...) -> None: ...

class StopContainerRequest(_message.Message):
    __slots__ = ("container_id", "token", "grace_ms", "reason")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    token: ContainerToken
    grace_ms: int
    reason: str
    def __init__(self, container_id: _Optional[str] = ..., token: _Optional[_Union[ContainerToken, _Mapping]] = ..., grace_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class StopContainerResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: ContainerStatus
    def __init__(self, status: _Optional[_Union[ContainerStatus, _Mapping]] = ...) -> None: ...

class ContainerStatusRequest(_message.Message):
    __slots__ = ("container_ids", "tokens")
    CONTAINER_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    container_ids: _containers.RepeatedScalarFieldContainer[str]
    tokens: _containers.RepeatedCompositeFieldContainer[ContainerToken]
    def __init__(self, container_ids: _Optional[_Iterable[str]] = ..., tokens: _Optional[_Iterable[_Union[ContainerToken, _Mapping]]] = ...) -> None: ...

class ContainerStatusResponse(_message.Message):
    __slots__ = ("statuses",)
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedCompositeFieldContainer[ContainerStatus]
    def __init__(self, statuses: _Optional[_Iterable[_Union[ContainerStatus, _Mapping]]] = ...) -> None: ...

class ReadLogRequest(_message.Message):
    __slots__ = ("container_id", "offset", "max_bytes", "token")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    offset: int
    max_bytes: int
    token: ContainerToken
    def __init__(self, container_id: _Optional[str] = ..., offset: _Optional[int] = ..., max_bytes: _Optional[int] = ..., token: _Optional[_Union[ContainerToken, _Mapping]] = ...) -> None: ...

class ReadLogResponse(_message.Message):
    __slots__ = ("data", "next_offset", "size", "container_done")
    DATA_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_DONE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    next_offset: int
    size: int
    container_done: bool
    def __init__(self, data: _Optional[bytes] = ..., next_offset: _Optional[int] = ..., size: _Optional[int] = ..., container_done: _Optional[bool] = ...) -> None: ...

class ReservePortRequest(_message.Message):
    __slots__ = ("job_id", "token")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    token: ContainerToken
    def __init__(self, job_id: _Optional[str] = ..., token: _Optional[_Union[ContainerToken, _Mapping]] = ...) -> None: ...

class ReservePortResponse(_message.Message):
    __slots__ = ("port",)
    PORT_FIELD_NUMBER: _ClassVar[int]
    port: int
    def __init__(self, port: _Optional[int] = ...) -> None: ...
