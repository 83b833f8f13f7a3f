"""The torch.distributed adapter: one tiny all-reduce per agreement, on the caller's process group.

>>> import torch.distributed as dist
>>> dist.init_process_group("gloo")              # or nccl; torchrun sets the environment
>>> with rank_lock(url, holder_rank=0, every=10, ttl=60.0) as ranks:
...     steps = ranks.steps(range(start, total))
...     for step in steps:
...         train(step)
...     save_checkpoint(steps.last)

The vote is a small int32 tensor (yield, the exit causes, lost) all-reduced
with MAX: one collective carries every flag, so a loss is never missed by a
rank waiting for the yield flag. Its device is the one the process group is
bound to (``init_process_group(device_id=...)``); else the CPU for gloo (and
for a ``cpu:gloo,cuda:nccl`` group); for nccl ``cuda:LOCAL_RANK`` where torchrun
set ``LOCAL_RANK``, else ``torch.cuda.current_device()`` (so call
``torch.cuda.set_device`` first when you launch ranks yourself). A failed
all-reduce (a rank died, or the group's timeout passed) raises
:class:`~handofflock.AgreementFailed` with torch's error chained; set the
group's ``timeout`` to bound how long a rank can wait for a dead peer.

DataLoader workers: launchers signal more than the rank (torchrun's shutdown
signals the rank's whole process group, Slurm every process of the step), and
a worker killed by the signal makes the rank raise ``DataLoader worker ... is
killed by signal`` before the ranks agree and checkpoint. So in a process that
calls :func:`rank_lock` (the callbacks call it too), each DataLoader worker
forked from then on ignores SIGTERM, SIGINT and SIGUSR1 (:func:`shield_worker`,
installed for you), and still ends with its rank: when the DataLoader shuts it
down, when the rank dies (torch's worker watchdog), or at the rank's exit
(:func:`shield_dataloader_workers`). For a DataLoader whose workers are
spawned (``multiprocessing_context="spawn"`` or ``"forkserver"``), pass
``worker_init_fn=shield_worker``.

Importing this module imports torch.
"""

from __future__ import annotations

import atexit
import functools
import mmap
import multiprocessing
import multiprocessing.util
import os
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.utils.data._utils import signal_handling
from torch.utils.data._utils.worker import _worker_loop

from ..core.errors import AgreementFailed, ConfigurationError
from ..core.identity import stable_job_id
from ..os_signals import SignalLike
from .checkpoints import LatestCheckpoint
from .ranks import DEFAULT_RANK_SIGNALS, Agree, RankLock, RankSignals, StopDecision, local_agree

if TYPE_CHECKING:
    from ..lock.handoff import HandoffLock

__all__ = [
    "RankHold",
    "agree_device",
    "rank_lock",
    "shield_dataloader_workers",
    "shield_worker",
    "tensor_agree",
    "torch_agree",
]


def torch_agree(group: Any = None, device: torch.device | str | None = None) -> Agree:
    """An :data:`~handofflock.integrations.ranks.Agree` doing one all-reduce (MAX) per call on ``group``.

    ``device`` defaults to :func:`agree_device` (the group's bound device, the CPU for gloo, this rank's GPU for nccl).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ConfigurationError(
            "torch_agree() needs an initialised process group (torch.distributed.init_process_group)"
        )
    backend = str(dist.get_backend(group))
    where = (
        torch.device(device)
        if device is not None
        else agree_device(group if group is not None else dist.group.WORLD, backend)
    )

    def all_reduce(votes: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=group)
        return votes

    return tensor_agree(all_reduce, device=lambda: where, rank=dist.get_rank, what=f"{backend} all-reduce failed")


def tensor_agree(
    reduce_max: Callable[[torch.Tensor], torch.Tensor], *, device: Callable[[], Any], rank: Callable[[], int], what: str
) -> Agree:
    """An :data:`~handofflock.integrations.ranks.Agree` that reduces the vote's flags, an int32 tensor on
    ``device()``, with ``reduce_max`` (MAX over the ranks); a failed reduce raises
    :class:`~handofflock.AgreementFailed`, saying ``what`` failed on rank ``rank()``."""

    def agree(flags: Sequence[bool]) -> Sequence[bool]:
        votes = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32, device=device())
        try:
            values = reduce_max(votes).tolist()  # waits for the collective (and copies back from the GPU)
        except Exception as exc:  # DistBackendError, RuntimeError: a peer died or timed out
            raise AgreementFailed(
                f"rank {rank()} could not agree with the other ranks ({what}: "
                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); another rank probably died "
                "or hung past the process group's timeout, so this rank stops"
            ) from exc
        return tuple(bool(v) for v in values)

    return agree


def agree_device(group: Any, backend: str, environ: Any = None) -> torch.device:
    """Where the vote tensor lives for ``group`` of ``backend`` (see the module docstring)."""
    bound = getattr(group, "bound_device_id", None)
    if bound is not None:
        return torch.device(bound)
    if "gloo" in backend or "nccl" not in backend:
        return torch.device("cpu")
    env = os.environ if environ is None else environ
    local = env.get("LOCAL_RANK")
    if local is not None and local.isdigit():
        return torch.device("cuda", int(local))
    return torch.device("cuda", torch.cuda.current_device())


def shield_worker(worker_id: int = 0) -> None:
    """A DataLoader ``worker_init_fn``: this worker ignores SIGTERM, SIGINT and SIGUSR1 (its rank decides).

    >>> loader = DataLoader(data, num_workers=2, multiprocessing_context="spawn", worker_init_fn=shield_worker)

    Forked workers of a process that called :func:`rank_lock` get it without
    asking (see :func:`shield_dataloader_workers`); pass it for spawned ones
    (call it from your own init function if you have one). The worker still
    ends with its rank: the DataLoader shuts it down, and torch's watchdog
    ends it once the rank is gone. A forked worker also obeys the signals
    once its rank is exiting; a spawned one shares nothing with its rank, so
    drop (or exhaust) the DataLoader's iterator before the rank exits, or
    multiprocessing's exit hook waits for it. A signal ignored (SIG_IGN) stays
    ignored; a program the worker runs gets the default actions back (a
    Python handler, unlike SIG_IGN, is not inherited across ``exec``).
    """
    for sig in DEFAULT_RANK_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _let_the_rank_decide)


def _let_the_rank_decide(signum: int, frame: object) -> None:
    """A shielded worker's handler: nothing while its rank lives on (the rank got the signal too, or decides)."""
    if _exiting is not None and _exiting[0]:
        # The rank is exiting, and multiprocessing's exit hook terminates its daemonic children: end, with
        # the status torch's own handler gives when the rank terminates a worker (a clean exit to its SIGCHLD).
        os._exit(0)


#: One shared byte, set when the process that made it exits; its forked DataLoader workers read it.
_exiting: mmap.mmap | None = None
#: The process whose DataLoader workers are shielded (a forked child is not it).
_shielding_pid: int | None = None


def shield_dataloader_workers() -> None:
    """Shield every DataLoader worker this process forks from now on (:func:`shield_worker`). Idempotent.

    :func:`rank_lock` calls it. A child that multiprocessing forks to run
    torch's DataLoader worker loop is shielded before the loop starts, and
    again right after the loop sets torch's own SIGTERM handler. When this
    process exits, its workers obey the signals again: an exit hook, which runs
    before multiprocessing's (atexit runs hooks in reverse order), sets a byte
    the workers share since the fork, so multiprocessing's ``terminate()`` of
    its daemonic children ends them at once instead of leaving the exit waiting.
    """
    global _exiting, _shielding_pid
    if _shielding_pid == os.getpid():
        return
    _exiting, _shielding_pid = mmap.mmap(-1, 1), os.getpid()  # anonymous and shared: forked children see writes
    multiprocessing.util.register_after_fork(_worker_loop, _shield_if_running)
    atexit.register(_unshield_at_exit)


def _unshield_at_exit() -> None:
    if _exiting is not None and os.getpid() == _shielding_pid:
        _exiting[0] = 1


def _shield_if_running(loop: Callable[..., None]) -> None:
    """In a child multiprocessing just forked: shield it if it is about to run ``loop`` (a DataLoader worker)."""
    if getattr(multiprocessing.current_process(), "_target", None) is not loop:
        return
    shield_worker()
    # The worker loop begins by setting torch's own SIGTERM handler (in C: exit if the rank sent it, else die of
    # it), which would undo the shield for SIGTERM: in this child only, shield again right after it.
    set_torch_handlers = signal_handling._set_worker_signal_handlers  # type: ignore[attr-defined]

    def then_shield(*args: Any) -> None:
        set_torch_handlers(*args)
        shield_worker()

    signal_handling._set_worker_signal_handlers = then_shield  # type: ignore[attr-defined]


def rank_lock(
    url: str | os.PathLike[str] | None = None,
    *,
    lock: HandoffLock | None = None,
    holder_rank: int = 0,
    group: Any = None,
    every: int = 1,
    poll: float = 1.0,
    signals: Iterable[SignalLike] = DEFAULT_RANK_SIGNALS,
    request_release: bool = True,
    priority: int = 0,
    latest: str | os.PathLike[str] | None = None,
    **lock_kwargs: Any,
) -> RankLock:
    """A :class:`~handofflock.integrations.ranks.RankLock` for this process's rank.

    On ``holder_rank`` (a global rank) it opens ``HandoffLock(url, **lock_kwargs)``
    (or uses ``lock``); elsewhere it opens nothing. Without an initialised
    process group the job is one rank, which holds the lock itself.

    * ``signals`` (default SIGTERM, SIGINT, SIGUSR1) become an agreed exit on
      every rank (:class:`~handofflock.integrations.ranks.RankSignals`,
      installed when called from the main thread; ``signals=()`` for none).
    * ``owner_id`` defaults to :func:`~handofflock.core.identity.stable_job_id`
      where the environment gives one (Slurm, a Kubernetes Job, torchrun's
      ``--rdzv-id``, ``HANDOFFLOCK_JOB_ID``): the record names the job the same
      across restarts; a restart (or a second job with that id) still waits for
      the other's lease like any party, and gets a higher fencing token.
    * ``wait_for_slot`` defaults to True: a job that finds another waiter
      waits for the slot instead of failing with ``LockContended``.
    * ``request_release`` and ``priority`` are what :meth:`RankLock.acquire`
      asks with (``HandoffLock.acquire``'s): ``request_release=False`` waits
      patiently, never asking the holder to yield.
    * ``latest``: where the job's latest-checkpoint pointer lives (a path or
      URL beside its checkpoints; :class:`~handofflock.integrations.checkpoints.LatestCheckpoint`),
      as ``ranks.latest`` on every rank. The holder claims it in
      ``acquire``; every rank reads it to resume (``ranks.latest.read()``), and
      calls ``ranks.point(path, step)`` once its part of a checkpoint is written
      (the holder writes, fenced by its token; a refused write is ``LockLost``
      on every rank).
    * DataLoader workers forked from then on ignore the signals the rank
      handles, and end with it (see the module docstring), where ``signals``
      are installed.
    * Under torchrun, a rank whose launcher is gone (its parent changed:
      torchrun was killed, by SIGUSR1 say, which it does not handle) votes an
      exit with the cause ``"launcher"`` at the next agreement.
    """
    if (url is None) == (lock is None):
        raise ConfigurationError("pass either url or lock")
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        if not 0 <= holder_rank < world:
            raise ConfigurationError(f"holder_rank {holder_rank} is not a rank of this job (world size {world})")
        agree = torch_agree(group)
    else:
        rank, agree = 0, local_agree
        if holder_rank != 0:
            raise ConfigurationError(f"holder_rank {holder_rank} in a job of one rank (no process group)")
    if rank == holder_rank:
        if lock is None:
            from ..lock.handoff import HandoffLock

            assert url is not None
            if lock_kwargs.get("owner_id") is None:
                lock_kwargs["owner_id"] = stable_job_id()
            lock_kwargs.setdefault("wait_for_slot", True)
            lock = HandoffLock(url, **lock_kwargs)
    else:
        lock = None
    launcher = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None  # torchrun's agent started us
    ranks = RankLock(
        lock,
        agree,
        every=every,
        poll=poll,
        rank=rank,
        request_release=request_release,
        priority=priority,
        launcher=launcher,
        latest=None if latest is None else LatestCheckpoint(latest, lock=lock),
    )
    wanted = tuple(signals)
    if wanted and threading.current_thread() is threading.main_thread():
        ranks.signals = RankSignals(ranks, wanted).install()
        shield_dataloader_workers()
    return ranks


class RankHold:
    """What the framework callbacks share: the job's :class:`RankLock`, opened on first use, and how a run ended.

    ``url``, ``holder_rank``, ``every``, ``poll`` and ``lock_kwargs`` go to
    :func:`rank_lock` (``request_release=False`` and ``priority`` among them,
    and any ``HandoffLock`` keyword). After a run: ``yielded`` is True if it
    ended because the ranks agreed to stop, ``yield_step`` is the step of the
    checkpoint it saved, and ``decision`` what the ranks agreed (exit or
    yield); None after a full run.

    The signal handlers are ours from :meth:`acquire` to the end of the run
    (finished, stopped or failed); then the ones found come back, so a
    notebook's next "interrupt kernel" raises ``KeyboardInterrupt`` again. The
    same object serves the next run (:meth:`RankLock.start_over`).

    ``latest_url`` is where the job's latest-checkpoint pointer lives (set by
    the callbacks): :meth:`acquire` gives it to the ranks, and the holder claims it.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        holder_rank: int = 0,
        every: int = 1,
        poll: float = 1.0,
        **lock_kwargs: Any,
    ) -> None:
        self._open = functools.partial(rank_lock, url, holder_rank=holder_rank, every=every, poll=poll, **lock_kwargs)
        self.holder_rank = holder_rank
        self.latest_url: str | None = None
        self.ranks: RankLock | None = None
        self.yielded = False
        self.yield_step: int | None = None
        self.decision: StopDecision | None = None
        #: A run ended since the last acquire: the next one starts over.
        self._ended = False

    def acquire(self) -> None:
        """Take the lock for the job (call on every rank). A no-op while it is held."""
        if self.ranks is None:
            self.ranks = self._open()
        elif self._ended and not self.ranks.held:
            self.ranks.start_over()
        self._ended = False
        if self.ranks.signals is not None:
            self.ranks.signals.install()  # a signal while waiting ends the wait
        if not self.ranks.held:
            if self.latest_url is not None:  # the run's pointer (a Trainer's output_dir may change between runs)
                self.ranks.latest = LatestCheckpoint(self.latest_url, lock=self.ranks.lock)
            try:
                self.ranks.acquire()
            except BaseException:  # RankExit, or the lock could not be taken: this run is over
                self._end_run()
                raise
        self.yielded, self.yield_step, self.decision = False, None, None

    def _end_run(self, *, failed: bool = False) -> None:
        """The run is over (finished, stopped or failed): the lock goes, and the signal handlers found before are back.

        A run that ended as planned releases once every rank got here (the
        checkpoint is written), the holder handing the lock off; a ``failed``
        one lets the lock go at once, without meeting: the other ranks may be gone.
        """
        if self.ranks is not None and failed:
            self.ranks.abandon()
        elif self.ranks is not None and self.ranks.held:
            self.ranks.release()
        self._ended = True
        on_main = threading.current_thread() is threading.main_thread()  # where handlers can be set
        if on_main and self.ranks is not None and self.ranks.signals is not None:
            self.ranks.signals.uninstall()

    def _stopped(self, step: int) -> None:
        """The ranks agreed to stop after ``step``."""
        assert self.ranks is not None
        self.yielded, self.yield_step, self.decision = True, step, self.ranks.decision

    def _decision_json(self) -> dict[str, str] | None:
        decision = self.decision
        return None if decision is None else {"action": decision.action, "cause": decision.cause}
