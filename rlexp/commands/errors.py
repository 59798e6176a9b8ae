"""How an ``rlexp`` command reports an error: one line ``error: ...`` on stderr, exit status 2 for a configuration
error (a bad override, a missing config option, an invalid value) and 1 for anything else; the traceback too
with ``--verbose`` (``rlexp --verbose train ...`` or ``rlexp train --verbose ...``) or ``HYDRA_FULL_ERROR=1``.

The errors a user can fix (a config error, a missing file, an unreachable tracking server, a refused store, no
space left on device, a bad checkpoint) are their message alone; any other exception is its type and message,
with a pointer to ``--verbose``. In a Hydra job the traceback also goes to the job's log file (``job_errors``),
and the line says where.

The Hydra apps (train, eval, bench) run with ``HYDRA_FULL_ERROR=1`` set for them, so Hydra hands every
exception on instead of printing its own report; ``run_hydra_app`` swallows the one line Hydra still writes
for a failed job (``Error executing job with overrides: [...]``); the error line of a multirun names the job
(its number and overrides). A failed job still fails its multirun or sweep as Hydra decides. Without
``--verbose``, a log handler that fails (stdout a pipe whose reader died) prints no traceback either
(``logging.raiseExceptions``)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import sys
import traceback

CONFIG_EXIT = 2
ERROR_EXIT = 1

JOB_FAILED = "Error executing job with overrides: "
# lines of Hydra's and OmegaConf's messages that only add noise to a one-line error
_NOISE = re.compile(
    r"^(See https?://|Config search path|provider=|full_key:|reference_type=|object_type=|"
    r"Set the environment variable HYDRA_FULL_ERROR)"
)


def verbose_env() -> bool:
    return os.environ.get("HYDRA_FULL_ERROR", "") == "1"


def _config_types() -> tuple[type, ...]:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from rlexp.config.schema import ConfigError

    types = [ConfigError, HydraException, OmegaConfBaseException]
    with contextlib.suppress(ImportError):
        from rlexp.sweeping.search_space import SearchSpaceError
        from rlexp.sweeping.settings import SweepConfigError

        types += [SweepConfigError, SearchSpaceError]
    return tuple(types)


def _user_types() -> tuple[type, ...]:
    types: list[type] = [ConnectionError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError]
    with contextlib.suppress(ImportError):
        from rlexp.tracking.sqlite_store import StoreError

        types.append(StoreError)
    with contextlib.suppress(ImportError):
        from rlexp.trainer.checkpoint import CheckpointError

        types.append(CheckpointError)
    return tuple(types)


def is_config_error(e: BaseException) -> bool:
    return isinstance(e, _config_types())


def is_user_error(e: BaseException) -> bool:
    if is_config_error(e) or isinstance(e, _user_types()):
        return True
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return True
    return _connection_failure(e)


def _connection_failure(e: BaseException) -> bool:
    """A tracking server that does not answer (MLflow wraps the requests error in an ``MlflowException``)."""
    text = str(e)
    return type(e).__name__ == "MlflowException" and (
        "Max retries exceeded" in text or "Failed to establish a new connection" in text or "timed out" in text
    )


def exit_code(e: BaseException) -> int:
    return CONFIG_EXIT if is_config_error(e) else ERROR_EXIT


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not _NOISE.match(ln.strip())]


def _options(text: str) -> tuple[str, str] | None:
    """Hydra's 'Available options in 'group':' block, folded: (head, 'a, b, c')."""
    m = re.search(r"Available options in '([^']+)':\n((?:\t[^\n]*\n?)+)", text)
    if not m:
        return None
    return m.group(1), ", ".join(x.strip() for x in m.group(2).splitlines() if x.strip())


def message(e: BaseException) -> str:
    """The error as one line (without the ``error:`` prefix)."""
    text = str(e)
    if isinstance(e, OSError) and e.errno == errno.ENOSPC and e.filename:
        return f"no space left on device: {e.filename}"
    if isinstance(e, FileNotFoundError) and e.filename and e.strerror:  # an OSError of its own
        return f"{e.strerror}: {e.filename}"
    if _connection_failure(e):
        from rlexp.tracking.replay import connection_reason

        m = re.search(r"API request to (https?://[^/\s]+)", text)
        where = f" at {m.group(1)}" if m else ""
        return f"cannot reach the MLflow tracking server{where}: {connection_reason(e)}"
    opts = _options(text)
    lines = _lines(text.split("\nAvailable options in")[0] if opts else text)
    cause = e.__cause__
    if cause is not None and is_config_error(e) and type(cause).__module__.startswith("omegaconf"):
        extra = _lines(str(cause))
        if extra and extra[0] not in lines:
            lines.append(extra[0])
    override = getattr(e, "override", None)  # hydra's OverrideParseException: its message leaves the override out
    if isinstance(override, str) and lines and override not in lines[0]:
        lines.insert(0, f"bad override {override!r}")
    out = ": ".join(lines) if lines else type(e).__name__
    if opts:
        out += f" (options in {opts[0]}: {opts[1]})"
    out = re.sub(r"^rlexp \w+: ", "", out)  # the command is the one the user ran
    if not is_user_error(e):
        out = f"{type(e).__name__}: {out}" if lines else out
    if len(out) > 2000:
        out = out[:2000] + " ..."
    return out


def report(e: BaseException, verbose: bool) -> int:
    """Print ``e`` (one line, or the traceback then the line) on stderr; return the exit status."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    line = message(e)
    job = getattr(e, "rlexp_job", None)
    if job:
        line = f"job {job}: {line}"
    log_file = getattr(e, "rlexp_log_file", None)
    if verbose:
        traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
    elif not is_user_error(e):
        line += f" (traceback: rerun with --verbose{f', or see {log_file}' if log_file else ''})"
    try:
        print(f"error: {line}", file=sys.stderr)
    except OSError:
        pass
    return exit_code(e)


@contextlib.contextmanager
def job_errors():
    """Around a Hydra task function: an exception's traceback goes to the job's log file(s) (not the console)
    and the exception is re-raised with ``rlexp_log_file`` naming the file."""
    try:
        yield
    except Exception as e:
        files = []
        record = logging.LogRecord(
            "rlexp", logging.ERROR, __file__, 0, "%s", (message(e),), (type(e), e, e.__traceback__)
        )
        for h in logging.getLogger().handlers:
            if isinstance(h, logging.FileHandler):
                with contextlib.suppress(Exception):
                    h.handle(record)
                    files.append(h.baseFilename)
        with contextlib.suppress(Exception):
            if files:
                e.rlexp_log_file = os.path.relpath(files[0])
            from hydra.core.hydra_config import HydraConfig
            from hydra.types import RunMode

            hc = HydraConfig.get()
            if hc.mode == RunMode.MULTIRUN:  # the error line names the job of a multirun
                e.rlexp_job = f"#{hc.job.num} ({' '.join(hc.overrides.task)})"
        raise


class _HydraStderr:
    """sys.stderr while a Hydra app runs: drops the line Hydra writes for a failed job (the error line names the
    job instead; a sweep logs its failed trials itself)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, s):
        if isinstance(s, str) and s.startswith(JOB_FAILED):
            return len(s)
        return self._stream.write(s)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def run_hydra_app(main, argv: list[str], verbose: bool) -> None:
    """Run a Hydra app (``main`` reads ``sys.argv``) with the error reporting above; exits on an error."""
    saved_env = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises instead of printing its own report
    saved_argv, saved_err = sys.argv, sys.stderr
    sys.argv = argv
    saved_raise = logging.raiseExceptions
    if not verbose:
        sys.stderr = _HydraStderr(saved_err)
        logging.raiseExceptions = False  # a log handler's failure (stdout a dead pipe) prints no traceback
    try:
        main()
    except Exception as e:
        sys.stderr = saved_err
        sys.exit(report(e, verbose))
    finally:
        sys.stderr = saved_err
        sys.argv = saved_argv
        logging.raiseExceptions = saved_raise
        if saved_env is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved_env


def run_command(main, argv: list[str], verbose: bool) -> None:
    """Run a plain command (``main(argv)``) with the error reporting above; exits on an error. A ``SystemExit``
    with a message (an argument the command refuses) becomes an ``error:`` line with exit status 1."""
    try:
        main(argv)
    except SystemExit as e:
        if isinstance(e.code, str):
            msg = re.sub(r"^rlexp \w+: ", "", e.code)
            print(f"error: {msg}", file=sys.stderr)
            sys.exit(ERROR_EXIT)
        raise
    except Exception as e:
        sys.exit(report(e, verbose))
