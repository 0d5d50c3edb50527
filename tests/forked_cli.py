"""`specdec ARGS...` in a process forked from one that has already imported the libraries every command
imports (DuckDB, pandas, pyarrow, numpy), instead of a new interpreter importing them again.

The suite runs the CLI about 200 times; a new interpreter spends 0.5 s of CPU importing those four before the
command does anything, about 100 CPU-s of a suite that is CPU-bound on two cores. The forked process is a
process of its own as a user's is: its own arguments, environment, working folder and standard streams (files
here, as a pipe's reader sees them: not a terminal), its exit status, `atexit` and threads joined at exit as an
interpreter's; it imports specdec_core afresh. What it can't have is an interpreter started with different
settings, so an environment that changes them (PYTHON*, the locale, the thread counts numpy reads when
imported) gets a new interpreter, as does a call from a second thread while one runs.

Run as a script, this is the server (one per test process, started at its first call): it reads one request a
line on stdin, forks, answers the child's pid and then its exit status.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

PRELOAD = ("numpy", "pandas", "pyarrow", "duckdb")
# What a new interpreter reads when it starts or imports PRELOAD: a request that changes one is not forked.
STARTUP_PREFIXES = ("PYTHON", "LANG", "LC_", "OMP_", "OPENBLAS_", "MKL_")


def startup_settings(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES)}


def _exit_code(code: object) -> int:
    """What an interpreter exits with when SystemExit carries `code` (and prints, for a message)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _child(request: dict[str, Any], reply: int) -> None:
    import atexit
    import runpy
    import traceback

    os.close(reply)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in ((0, request["stdin"], os.O_RDONLY), (1, request["stdout"], os.O_WRONLY),
                            (2, request["stderr"], os.O_WRONLY)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.path[0] = os.getcwd()  # as `python -m` puts it
    sys.argv = [sys.executable, *request["args"]]
    try:
        runpy.run_module("specdec_core", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()  # what an interpreter does at exit, in its order: threads, atexit, streams
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def serve() -> None:
    for name in PRELOAD:
        __import__(name)
    reply = os.dup(1)

    def answer(**fields: Any) -> None:
        os.write(reply, (json.dumps(fields) + "\n").encode())

    answer(ready=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                _child(request, reply)
            finally:
                os._exit(1)  # the child never goes back to reading requests, whatever went wrong
        answer(pid=pid)
        _, status = os.waitpid(pid, 0)
        answer(returncode=os.waitstatus_to_exitcode(status))


class _Server:
    """The fork server of this process, started at the first call and again if it died."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.settings: dict[str, str] = {}
        self.pending = b""

    def start(self) -> subprocess.Popen[bytes]:
        if self.proc is None or self.proc.poll() is not None:
            self.settings = startup_settings(dict(os.environ))
            self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         bufsize=0, cwd=Path(__file__).parent)
            self.pending = b""
            self.answer(None)
        return self.proc

    def answer(self, timeout: float | None) -> dict[str, Any] | None:
        """The server's next answer, or None if none came within `timeout` seconds."""
        assert self.proc is not None and self.proc.stdout is not None
        while b"\n" not in self.pending:
            if not select.select([self.proc.stdout], [], [], timeout)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError("the CLI fork server exited")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, args: list[str], timeout: float, cwd: Any, env: dict[str, str], input: str | None,
            ) -> subprocess.CompletedProcess[str]:
        proc = self.proc
        assert proc is not None and proc.stdin is not None
        with tempfile.TemporaryDirectory(prefix="specdec-cli-") as folder:
            paths = {name: Path(folder, name) for name in ("stdin", "stdout", "stderr")}
            paths["stdin"].write_text(input or "", encoding="utf-8")
            for name in ("stdout", "stderr"):
                paths[name].touch()
            request = {"args": args, "cwd": str(Path(cwd or os.getcwd()).resolve()), "env": env,
                       **{name: str(path) for name, path in paths.items()}}
            proc.stdin.write((json.dumps(request) + "\n").encode())
            pid = self.answer(None)["pid"]
            done = self.answer(timeout)
            if done is None:
                with contextlib.suppress(ProcessLookupError):  # it ended as the time ran out
                    os.kill(pid, signal.SIGKILL)
                self.answer(None)
            out, err = (paths[name].read_bytes().decode("utf-8", errors="replace").replace("\r\n", "\n")
                        for name in ("stdout", "stderr"))
        command = [sys.executable, "-m", "specdec_core", *args]
        if done is None:
            raise subprocess.TimeoutExpired(command, timeout, output=out, stderr=err)
        return subprocess.CompletedProcess(command, done["returncode"], out, err)


_SERVER = _Server()


def run_forked(args: list[str], timeout: float, cwd: Any = None, env: dict[str, str] | None = None,
               input: str | None = None) -> subprocess.CompletedProcess[str] | None:
    """The command's result, or None where it can't be forked (its caller then starts an interpreter)."""
    env = dict(os.environ if env is None else env)
    if cwd is not None and not Path(cwd).is_dir():
        return None  # subprocess's own error for it
    if not _SERVER.lock.acquire(blocking=False):
        return None
    try:
        _SERVER.start()  # again if it died; run() then uses it
        if startup_settings(env) != _SERVER.settings:
            return None
        return _SERVER.run(args, timeout, cwd, env, input)
    finally:
        _SERVER.lock.release()


if __name__ == "__main__":
    serve()
