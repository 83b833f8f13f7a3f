"""Who this process is, for people: the default label a holder or waiter writes beside its id.

``status`` shows ``owner vm:13179:30e5021e`` otherwise, which says nothing about
which job, pod or Slurm job holds the GPU. :func:`detect_label` reads what the
environment tells (nothing is fetched over the network):

========================  =====================================================
``host=``                 ``socket.gethostname()`` (left out when it is the pod's name)
``pid=``                  this process
``pod=NAMESPACE/NAME``    ``POD_NAME`` and ``POD_NAMESPACE`` (the usual names for
                          the downward API's ``metadata.name`` and
                          ``metadata.namespace``); without ``POD_NAME``, inside
                          Kubernetes (``KUBERNETES_SERVICE_HOST`` set), ``HOSTNAME``,
                          which is the pod's name unless the spec sets
                          ``hostname``; without ``POD_NAMESPACE``, the service
                          account's namespace file where it is mounted
``slurm=JOB[_TASK][.STEP]``  ``SLURM_JOB_ID`` (``SLURM_ARRAY_JOB_ID_SLURM_ARRAY_TASK_ID``
                          for an array task; ``.SLURM_STEP_ID`` inside an ``srun`` step)
``rank=R``                torchrun's ``RANK`` (when ``LOCAL_RANK`` or
                          ``TORCHELASTIC_RUN_ID`` says torchrun set it)
========================  =====================================================

For example ``pod=ml/train-0 pid=1 rank=0`` or ``host=gpu-3 pid=4242 slurm=812345``.

:func:`stable_job_id` is different: an *owner id* for a job that stays the same
when the job is restarted, so ``status`` and the logs name the same job across
restarts. It never lets a restart take from a live predecessor: each lock object
is its own party, and a restart waits for its predecessor's lease (at once if
that released, ``ttl`` + ``max_clock_skew`` after its last renewal if it died
holding the lock). The first of these that is set wins:

==================================  ===========================================
``HANDOFFLOCK_JOB_ID``              yours, verbatim (``job:`` prefixed)
``SLURM_JOB_ID``                    ``slurm:JOB``; ``slurm:ARRAYJOB_TASK`` for an
                                    array task (``SLURM_ARRAY_JOB_ID``,
                                    ``SLURM_ARRAY_TASK_ID``); ``.STEP`` added
                                    inside an ``srun`` step (``SLURM_STEP_ID``),
                                    so two steps of one allocation differ. Kept by
                                    ``scontrol requeue`` and ``--requeue``.
``KUBERNETES_JOB_NAME``             ``k8s:NAMESPACE/NAME[/INDEX]``: set it with the
                                    downward API from the pod's label
                                    ``batch.kubernetes.io/job-name`` (or
                                    ``job-name``); ``POD_NAMESPACE`` (or the
                                    service account's namespace) and, for an
                                    Indexed Job, ``JOB_COMPLETION_INDEX`` (set
                                    by Kubernetes) are added. Kept across the
                                    Job's pod restarts and Kueue's requeues.
``TORCHELASTIC_RUN_ID``             ``torchrun:ID``: torchrun's ``--rdzv-id``; kept
                                    across ``--max-restarts``. Not torchrun's
                                    default ``none``, and new on every launch with
                                    ``--standalone`` (pass ``--rdzv-id``).
==================================  ===========================================

Two jobs must never share one: the id is the job's claim on its place.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from .record import MAX_ID_LENGTH, MAX_LABEL_LENGTH

#: Where Kubernetes mounts the pod's service account, including its namespace.
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def detect_label(
    environ: Mapping[str, str] | None = None,
    *,
    pid: int | None = None,
    host: str | None = None,
    namespace_file: str = SERVICE_ACCOUNT_NAMESPACE,
) -> str:
    """The label this process would write: ``key=value`` words from the environment (see the module docstring)."""
    env = os.environ if environ is None else environ
    host = socket.gethostname() if host is None else host
    words: list[str] = []

    pod = env.get("POD_NAME") or (env.get("HOSTNAME") if env.get("KUBERNETES_SERVICE_HOST") else None)
    if pod:
        namespace = _namespace(env, namespace_file)
        words.append(f"pod={namespace}/{pod}" if namespace else f"pod={pod}")
    if host and host != pod:
        words.insert(0, f"host={host}")
    words.append(f"pid={os.getpid() if pid is None else pid}")

    if job := _slurm_job(env):
        words.append(f"slurm={job}")
    if env.get("RANK") and (env.get("LOCAL_RANK") is not None or env.get("TORCHELASTIC_RUN_ID")):
        words.append(f"rank={env['RANK']}")
    return clean_label(" ".join(words))


def stable_job_id(
    environ: Mapping[str, str] | None = None, *, namespace_file: str = SERVICE_ACCOUNT_NAMESPACE
) -> str | None:
    """An owner id that survives this job's restarts, from the environment (see the module docstring); or None."""
    env = os.environ if environ is None else environ
    if own := env.get("HANDOFFLOCK_JOB_ID", "").strip():
        return _fit(f"job:{own}")
    if job := _slurm_job(env):
        return _fit(f"slurm:{job}")
    if name := env.get("KUBERNETES_JOB_NAME", "").strip():
        namespace = _namespace(env, namespace_file) or "default"
        index = env.get("JOB_COMPLETION_INDEX")
        return _fit(f"k8s:{namespace}/{name}" + (f"/{index}" if index else ""))
    run = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if run and run != "none":
        return _fit(f"torchrun:{run}")
    return None


def _fit(text: str) -> str:
    # An owner id has no control characters and at most MAX_ID_LENGTH characters (record.id_problem).
    return "".join(ch for ch in text if 0x20 <= ord(ch) != 0x7F)[:MAX_ID_LENGTH]


def clean_label(text: str) -> str:
    """``text`` made fit for a record: control characters become spaces, cut to the longest label."""
    text = "".join(" " if ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 else ch for ch in text).strip()
    return text[:MAX_LABEL_LENGTH] or "unknown"


def _slurm_job(env: Mapping[str, str]) -> str | None:
    """The Slurm job: ``ARRAYJOB_TASK`` for an array task, else the job id, then ``.STEP`` inside an ``srun``
    step; None outside Slurm. Two steps of one allocation are two jobs; a requeued job numbers its steps again."""
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    else:
        job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or ""
    if job and step.isdigit() and int(step) < _SLURM_SPECIAL_STEPS:
        job += f".{step}"
    return job or None


#: Slurm's step ids from here up name its own steps (batch, extern, interactive), not an ``srun``.
_SLURM_SPECIAL_STEPS = 0xFFFFFFF0


def _namespace(env: Mapping[str, str], namespace_file: str) -> str | None:
    """The pod's namespace: ``POD_NAMESPACE``, else the first line of the service account's namespace file."""
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"]
    try:
        with open(namespace_file, encoding="utf-8", errors="replace") as f:
            return f.readline().strip() or None
    except OSError:
        return None
