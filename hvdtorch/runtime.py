"""init() / shutdown() and the process-wide state behind the API.

init() joins the job through torch.distributed (adopting an existing default
process group if the script already made one), creates two private Gloo
groups -- one for negotiation, one for data -- learns every rank's host, and
starts the C++ engine. shutdown() stops the engine, destroys what init()
created and removes any rendezvous file; it is idempotent, and init() works
again after it.

Joining and leaving the default group, the device groups' backend and
destroy_groups() are process_groups.py's (destroy_groups stays reachable
here); what reads the state, the process sets' own groups among it, is here.
"""

import atexit
import datetime
import os
import secrets
import sys
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch.distributed as dist

# Imported before any process group exists on purpose: this module's
# functions take `group=group.WORLD` as default arguments, evaluated at import,
# so importing it later (torch.optim does, through torch._dynamo) would pin the
# default group that init() creates, and with it Gloo's threads and sockets,
# for the life of the process, past shutdown().
import torch.distributed.nn.functional  # noqa: F401

from . import knob_names, launch
from .process_groups import _device_backend, _device_group, _join_default_group, _leave_default_group, destroy_groups

_lock = threading.Lock()


@dataclass
class _State:
    engine: object
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    launcher: str
    homogeneous: bool  # every host runs the same number of ranks
    control_group: object
    data_group: object
    device_group: Optional[object]  # see _device_backend()
    group_timeout: datetime.timedelta
    owns_default_group: bool
    store_path: Optional[str]
    shm_token: str  # names this job's shared-memory segments (/dev/shm/hvdtorch-<token>...)
    excepthook: object  # sys.excepthook before init(): init_process_group wraps it anew each time
    options: Dict[str, str] = field(default_factory=dict)
    name_counters: Dict[str, int] = field(default_factory=dict)
    set_groups: Dict[int, tuple] = field(default_factory=dict)  # process set id -> (host, device) groups
    joins: int = 0  # join()s completed: unnamed ops are numbered afresh after each
    # Objects whose ops a joined rank still takes part in (take_part_while_joined), as weak references.
    join_participants: List[object] = field(default_factory=list)


_state: Optional[_State] = None

# Hooks of the modules above this one, which runtime never imports (it is the
# bottom layer): each module registers its hooks when it is imported, and they
# run in registration order.
#   init:     after the engine started, with init()'s process_sets argument
#             (process-set management adds the listed sets)
#   shutdown: before the engine stops (process sets forget their ids)
#   join:     after join() returned on this rank (autotune stops tuning)
_init_hooks: List[Callable[[object], None]] = []
_shutdown_hooks: List[Callable[[], None]] = []
_join_hooks: List[Callable[[], None]] = []


def on_init(hook: Callable[[object], None]) -> None:
    _init_hooks.append(hook)


def on_shutdown(hook: Callable[[], None]) -> None:
    _shutdown_hooks.append(hook)


def on_join(hook: Callable[[], None]) -> None:
    _join_hooks.append(hook)


class NotInitializedError(ValueError):
    pass


def _require() -> _State:
    if _state is None:
        raise NotInitializedError("hvdtorch has not been initialized; call hvdtorch.init() first")
    return _state


def _export_torch_env(st: "_State") -> None:
    """Code written for torchrun looks for RANK, WORLD_SIZE, LOCAL_RANK and
    LOCAL_WORLD_SIZE (torch.distributed's env:// names): under mpirun, srun
    or a plain `python`, where the launcher set none of them, init() sets
    them to this job's, so such code after init() sees the job it runs in.
    Values the launcher set are left alone; those set here go at shutdown(),
    so that a later init() reads the launcher's environment as it was."""
    for key, value in (
        ("RANK", st.rank),
        ("WORLD_SIZE", st.size),
        ("LOCAL_RANK", st.local_rank),
        ("LOCAL_WORLD_SIZE", st.local_size),
    ):
        if key not in os.environ:
            os.environ[key] = str(value)
            _exported_env.add(key)


def _unexport_torch_env() -> None:
    for key in _exported_env:
        os.environ.pop(key, None)
    _exported_env.clear()


# The torch.distributed variables init() set (_export_torch_env).
_exported_env = set()


def make_set_groups(ranks: List[int]) -> Tuple[Optional[object], Optional[object]]:
    """A process set's own (host, device) groups over exactly ``ranks``, for
    its device tensors as the global set has the engine's: (None, None)
    where no device group applies, and on ranks outside the set. A
    collective over every rank (torch's new_group), members or not."""
    st = state()
    backend = _device_backend()
    if backend is None:
        return None, None
    host = dist.new_group(ranks=ranks, backend="gloo", timeout=st.group_timeout)
    device = dist.new_group(ranks=ranks, backend=backend, timeout=st.group_timeout)
    if st.rank not in ranks:
        return None, None
    return host, device


def keep_set_groups(psid: int, groups: Tuple[Optional[object], Optional[object]]) -> None:
    """Destroyed with the set (drop_set_groups) or at shutdown."""
    if groups[0] is not None:
        state().set_groups[psid] = groups


def drop_set_groups(psid: int) -> None:
    destroy_groups(state().set_groups.pop(psid, ()))


_warned_variables: set = set()


def _warn_unknown_variables() -> None:
    """Once per variable and process: an HVDTORCH_* variable that is no knob (knob_names.py)."""
    for name, near in knob_names.unknown_variables(os.environ):
        if name in _warned_variables:
            continue
        _warned_variables.add(name)
        hint = f"; did you mean {near}?" if near else ""
        warnings.warn(
            f"hvdtorch: {name} is set but is no hvdtorch knob, so it changes nothing{hint} "
            "(python -m hvdtorch.check lists the knobs)",
            stacklevel=3,
        )


def init(comm=None, process_sets=None, **options) -> None:
    """Starts hvdtorch in this process.

    Options override HVDTORCH_* environment variables; the key is the variable
    name without the prefix, in lower case (``init(timeout=30,
    fusion_threshold=16 << 20, reducer="ring")``). ``process_sets``: a list
    of ProcessSet (or rank lists) to add once running, as Horovod takes it
    (``"dynamic"`` is accepted too: sets can always be added later).
    """
    global _state
    from . import _C  # noqa: F401  (fails early and clearly if the build is missing)

    if comm is not None:
        raise ValueError(
            "hvdtorch: comm= (MPI communicators) is not supported; launch with torchrun or mpirun "
            "and pass process_sets=[hvd.ProcessSet([...]), ...] for subsets of ranks"
        )
    with _lock:
        if _state is not None:
            return
        opts = {str(k): str(v) for k, v in options.items()}
        knob_names.check_option_names(opts)
        try:
            resolved = _C.resolve_options(opts)  # every knob's value checked here, on every rank
        except ValueError as e:
            raise ValueError(f"hvdtorch: {e}") from None
        _warn_unknown_variables()
        timeout = datetime.timedelta(seconds=resolved["timeout"])
        info = launch.detect()
        owns_default = not dist.is_initialized()
        excepthook = sys.excepthook
        store_path = _join_default_group(info, timeout) if owns_default else None
        rank, size = dist.get_rank(), dist.get_world_size()

        control = dist.new_group(backend="gloo", timeout=timeout)
        data = dist.new_group(backend="gloo", timeout=timeout)
        # Every rank's host, and one random token (rank 0's) that names this
        # job's shared-memory segments: launcher run ids are not unique
        # enough (torchrun's default is "none").
        gathered: List[Optional[tuple]] = [None] * size
        host = resolved["hostname"] or launch.hostname()
        dist.all_gather_object(gathered, (host, secrets.token_hex(6)), group=control)
        index: Dict[str, int] = {}
        host_of_rank = [index.setdefault(h, len(index)) for h, _ in gathered]
        shm_token = f"{os.getuid()}-{gathered[0][1]}"
        # What killed jobs left behind (their own exit handlers never ran): shared-memory
        # segments whose creator is dead, FileStore files whose launcher has exited.
        _C.remove_dead_shm_segments()
        launch.remove_stale_file_stores()

        # Simulated devices made from now on seed their streams with the rank
        # too: the ranks of a job share HVDTORCH_SIM_SEED, not its delays.
        _C.set_sim_rank(rank)
        device = _device_group(timeout)
        try:
            engine = _C.Engine(opts, rank, host_of_rank, control, data, shm_token, device)
        except BaseException:
            # Refused here (a knob that needs the topology to check, such as
            # THREAD_AFFINITY's CPU list) or failed: leave no group behind, so
            # a corrected init() starts clean.
            destroy_groups((device, data, control))
            if owns_default:
                _leave_default_group(store_path, rank, excepthook)
            raise
        topo = engine.topology()
        _state = _State(
            engine=engine,
            rank=rank,
            size=size,
            local_rank=topo["local_rank"],
            local_size=topo["local_size"],
            cross_rank=topo["cross_rank"],
            cross_size=topo["cross_size"],
            launcher=info.launcher,
            homogeneous=topo["homogeneous"],
            control_group=control,
            data_group=data,
            device_group=device,
            group_timeout=timeout,
            owns_default_group=owns_default,
            store_path=store_path,
            shm_token=shm_token,
            excepthook=excepthook,
            options=opts,
        )
        _export_torch_env(_state)
    # Outside the lock: adding sets runs collectives, which need the state.
    for hook in _init_hooks:
        hook(process_sets)


def shutdown() -> None:
    """Stops hvdtorch on this rank (and, through the engine, the others' pending ops)."""
    global _state
    with _lock:
        st, _state = _state, None
    if st is None:
        return
    _unexport_torch_env()
    for hook in _shutdown_hooks:
        hook()
    st.engine.shutdown()
    for groups in st.set_groups.values():
        destroy_groups(groups)
    destroy_groups((st.device_group, st.data_group, st.control_group))
    if st.owns_default_group:
        _leave_default_group(st.store_path, st.rank, st.excepthook)


atexit.register(shutdown)


def is_initialized() -> bool:
    return _state is not None


def state() -> _State:
    return _require()


def next_name(kind: str) -> str:
    """Names for unnamed ops: every rank must call them in the same order."""
    st = _require()
    n = st.name_counters.get(kind, 0)
    st.name_counters[kind] = n + 1
    return f"{kind}.noname.{n}" if st.joins == 0 else f"{kind}.noname.j{st.joins}.{n}"


def take_part_while_joined(participant) -> None:
    """After this rank calls join(), ``participant`` still runs its ops with
    the others (named with _C.NO_STAND_IN_PREFIX, so that joined ranks are
    not stood in for). Its contract: ``listen_while_joined()`` starts
    waiting for what the ranks with data do next and returns a token;
    ``heard(token)`` says, without blocking, whether that has arrived;
    ``joined_phase(token)`` does it (blocking until it has arrived) and
    returns False once every rank has joined. Held weakly, for this init()."""
    _require().join_participants.append(weakref.ref(participant))


def run_joined_rounds() -> None:
    """Inside join(), once this rank's join is submitted: every live
    participant listens at once, and each does what the ranks with data
    announce, in the order they announce it (a training loop may step two
    optimizers in any order), until every one has heard that every rank
    has joined."""
    st = _require()
    live = [p for p in (ref() for ref in st.join_participants) if p is not None]
    tokens = [p.listen_while_joined() for p in live]
    while live:
        ready = next((i for i, (p, t) in enumerate(zip(live, tokens)) if len(live) == 1 or p.heard(t)), None)
        if ready is None:
            time.sleep(0.0005)
            continue
        if live[ready].joined_phase(tokens[ready]):
            tokens[ready] = live[ready].listen_while_joined()
        else:
            del live[ready], tokens[ready]


def joined() -> None:
    """After join(): ranks that ran out of data submitted fewer unnamed ops
    than the others, so every rank numbers them afresh from here (join()
    completes at the same point of every rank's op sequence)."""
    st = _require()
    st.joins += 1
    st.name_counters.clear()
    for hook in _join_hooks:
        hook()


def rank() -> int:
    return _require().rank


def size() -> int:
    return _require().size


def local_rank() -> int:
    return _require().local_rank


def local_size() -> int:
    return _require().local_size


def cross_rank() -> int:
    return _require().cross_rank


def cross_size() -> int:
    return _require().cross_size


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks (the same answer on every rank)."""
    return _require().homogeneous


def mpi_threads_supported() -> bool:
    # Horovod raises when MPI is not in use, and hvdtorch never uses it.
    raise ValueError(
        "hvdtorch does not run on MPI (it meets the ranks through torch.distributed), "
        "so MPI multi-threading does not apply"
    )


def mpi_enabled() -> bool:
    return False


def mpi_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return True


def gloo_built() -> bool:
    return True


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def _build_info() -> Dict[str, object]:
    from . import _C

    return _C.build_info()


def cuda_built() -> bool:
    """True when this build compiled and linked the core's CUDA device: torch is
    a CUDA build and nvcc was found when hvdtorch was built. Then the
    collectives take CUDA tensors (without it, one is refused with an error
    naming it); ``python -m hvdtorch.check`` says what the build holds."""
    return bool(_build_info()["cuda_device"])


def rocm_built() -> bool:
    return False


def nccl_built() -> bool:
    """True when this build was compiled against a CUDA torch whose
    torch.distributed has its NCCL process group (a build fact, as in Horovod:
    it does not say whether a GPU is visible now)."""
    return bool(_build_info()["c10d_nccl"]) and dist.is_nccl_available()
