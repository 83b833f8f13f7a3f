"""Exit codes of the ``handofflock`` command (``docs/jobs.md`` has the table).

Chosen from sysexits(3) and the conventions of timeout(1) and the shells, so
scripts can tell "try again later" (75) from "fix the configuration" (64, 69).
``run`` otherwise passes its command's status through (128+N for signal N), or
``--yield-exit-code N`` after a yield (the command stopped within the grace
because the lock was asked for).
"""

import os

EXIT_OK = 0
EXIT_DECLINED = 1  # release --force answered "no"
EXIT_USAGE = 2  # bad arguments (argparse's own code)
EXIT_CONFIG = 64  # EX_USAGE: bad lock URL or configuration
EXIT_CORRUPT = 65  # EX_DATAERR: the lock record is corrupt
EXIT_STORAGE = 69  # EX_UNAVAILABLE: missing bucket, credentials, permission, store down
EXIT_LOST = 70  # EX_SOFTWARE: the lock was lost while run's command ran
EXIT_CONTENDED = 75  # EX_TEMPFAIL: another waiter, --nonblock on a held lock, a race
EXIT_TIMEOUT = 124  # as timeout(1)
EXIT_CANNOT_EXECUTE = 126  # as the shells
EXIT_NOT_FOUND = 127  # as the shells
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away (status | head), as the shells report cat

EXIT_CODES_HELP = """exit codes: CMD's own status (128+N if it died of signal N; N after a yield
  with --yield-exit-code N), or
  2 usage error          64 bad URL or configuration   65 corrupt lock record
  69 storage unavailable  70 lock lost while CMD ran    75 contended (another waiter; --nonblock)
  124 --timeout passed    126 CMD not executable        127 CMD not found
  128+N stopped by signal N while waiting  (status, watch: 141 when stdout's reader leaves)"""

#: Set by ``handofflock exec`` for its command: the file a job writes the status it decided to exit with.
EXIT_STATUS_FILE = "HANDOFFLOCK_EXIT_STATUS_FILE"


def report_exit_status(code: int | None) -> None:
    """Tell ``handofflock exec`` (if it started this job) the status the job will exit with; None withdraws it.

    torchrun exits 1 whatever its workers did, so a pod's ``podFailurePolicy``
    could not tell a yield (75) from a crash: ``exec`` exits with this status
    instead. Every rank may call it; the last write wins, whole.
    """
    path = os.environ.get(EXIT_STATUS_FILE)
    if not path:
        return
    try:
        if code is None:
            os.unlink(path)
            return
        part = f"{path}.{os.getpid()}"
        with open(part, "w", encoding="ascii") as f:
            f.write(f"{code}\n")
        os.replace(part, path)
    except OSError:
        pass
