"""Training runs started from a warm interpreter: the tests' fork server.

Why: most end-to-end tests run training scripts in processes of their own, as users run
theirs, two to six a test (each rank of a ``torchrun`` job is one). Each fresh interpreter
spent ~4.5 s of CPU importing torch before training a model for a second or two: on CI's
two cores, over a third of the suite's time. A server per pytest worker imports torch
once; each run is a ``fork`` of it that then runs the script as ``python`` would
(``sys.argv``, ``sys.path``, the environment, the working folder, ``__main__``, exit
status, the standard streams), in a process group of its own, and exits through the
interpreter's normal shutdown (``atexit`` handlers, non-daemon threads joined).

- :func:`run` is ``subprocess.run([sys.executable, ...], capture_output=True)``.
- For a ``python -m torch.distributed.run ... SCRIPT.py`` job, :func:`run` starts the real
  launcher and has it start each rank through a small shim (``python -S warm.py --rank``:
  no torch, milliseconds): torchrun sets the rank's environment and watches the shim, and
  the shim has the server fork the rank, hands over its standard streams and signals, and
  exits as the rank did. :func:`rank_command` is that shim for a launch line of its own.

What a warm start cannot give, and what is done instead: libraries that read their
environment when loaded read the server's (the OpenMP runtime's ``OMP_NUM_THREADS`` is
applied with ``torch.set_num_threads``); modules the server imported are not imported
again, so it imports nothing of this checkout (``probe`` comes from the run's own
``PYTHONPATH``), only torch and numpy: a run starts in the state ``import torch`` leaves,
which imports neither Dynamo nor Inductor (a test depends on when those are imported).
The server runs no tensor operation, so no thread pool is forked. Tests of the
interpreter itself (a crash, a signal, an install) and runs started side by side with
``Popen`` start fresh processes as before.

``PROBE_TEST_WARM=0`` turns the server off: every run a fresh interpreter."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import atexit
import shutil
import threading
from typing import Any, Optional

#: The environment variable that gives the shim the server's socket.
SOCKET = "PROBE_TEST_WARM_SOCKET"
_HERE = os.path.abspath(__file__)

_lock = threading.Lock()
_server: Optional[subprocess.Popen[bytes]] = None
_address = ""


def enabled() -> bool:
    return os.environ.get("PROBE_TEST_WARM", "1") != "0" and hasattr(os, "fork")


def _start() -> str:
    """This process's server (started at the first run), by its socket's path."""
    global _server, _address
    with _lock:
        if _server is None or _server.poll() is not None:
            _address = os.path.join(tempfile.mkdtemp(prefix="probe-warm-"), "s")
            _server = subprocess.Popen(
                [sys.executable, _HERE, "--serve", _address], stdout=subprocess.PIPE
            )
            atexit.register(_stop, _server, os.path.dirname(_address))
            assert _server.stdout is not None
            if _server.stdout.readline() != b"ready\n":
                raise RuntimeError("the tests' warm interpreter did not start")
        return _address


def _stop(server: subprocess.Popen[bytes], folder: str) -> None:
    server.kill()
    server.wait()
    shutil.rmtree(folder, ignore_errors=True)


def _request(
    address: str, argv: list[str], env: dict[str, str], cwd: str, fds: list[int]
) -> tuple[socket.socket, int]:
    """Ask the server at ``address`` to fork a run with standard streams ``fds``: the
    connection (closing it kills the run) and the run's pid."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(address)
    body = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode() + b"\n"
    socket.send_fds(conn, [body], fds)
    return conn, int(_line(conn))


def _line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(64)
        if not chunk:
            raise RuntimeError("the tests' warm interpreter closed the connection")
        data += chunk
    return data


def run(
    args: list[str],
    *,
    env: Optional[dict[str, str]] = None,
    cwd: Optional[str] = None,
    timeout: Optional[float] = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, *args], capture_output=True, text=True, ...)``,
    forked from the warm server when it is enabled; a ``torch.distributed.run`` job's
    ranks are forked from it too."""
    cmd = [sys.executable, *args]
    if not enabled():
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
        )
    address = _start()
    env = dict(os.environ if env is None else env)
    forked = _ranks_forked(list(args))
    if forked is not None:
        args, env[SOCKET] = forked, address
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        with open(os.devnull, "rb") as null:
            conn, _ = _request(
                address,
                list(args),
                env,
                os.path.abspath(cwd if cwd is not None else os.getcwd()),
                [null.fileno(), out.fileno(), err.fileno()],
            )
        code = None
        with conn:  # (closed at a timeout: the server kills the run's process group)
            conn.settimeout(timeout)
            try:
                code = int(_line(conn))
            except socket.timeout:
                pass
        out.seek(0)
        err.seek(0)
        if code is None:
            raise subprocess.TimeoutExpired(cmd, timeout or 0, out.read(), err.read())
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
        return subprocess.CompletedProcess(cmd, code, stdout, stderr)


def _ranks_forked(args: list[str]) -> Optional[list[str]]:
    """``-m torch.distributed.run OPTIONS SCRIPT.py ARGS`` with its ranks started through
    the shim (``--no-python python -S warm.py --rank SCRIPT.py ARGS``); None for any other
    command."""
    if args[:2] != ["-m", "torch.distributed.run"] or "--no-python" in args:
        return None
    at = next((i for i, a in enumerate(args) if i > 1 and a.endswith(".py")), None)
    if at is None or any(a in ("-m", "--module") for a in args[2:at]):
        return None
    return [*args[:at], "--no-python", sys.executable, "-S", _HERE, "--rank", *args[at:]]


def rank_command(env: dict[str, str]) -> list[str]:
    """The command that starts a rank (``COMMAND SCRIPT.py ARGS``) for a launch line of the
    test's own (torchrun ``--no-python``): the shim, with the server's socket put into
    ``env``; ``python`` itself when the server is off."""
    if not enabled():
        return [sys.executable]
    env[SOCKET] = _start()
    return [sys.executable, "-S", _HERE, "--rank"]


def _shim(argv: list[str]) -> None:
    """One rank under torchrun: have the server fork it with this process's environment
    and streams, pass on the signals torchrun sends, and exit as the rank did."""
    conn, pid = _request(os.environ[SOCKET], argv, dict(os.environ), os.getcwd(), [0, 1, 2])

    def forward(signum: int, _frame: Any) -> None:
        try:
            os.killpg(pid, signum)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    code = int(_line(conn))
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


# The server's side.

#: sys.path of the server without its own entries (this file's folder, its PYTHONPATH).
_BASE_PATH: list[str] = []


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked process: become ``python ARGV`` and run it. Never returns: the exit
    unwinds through the server's loop into the interpreter's normal shutdown."""
    import runpy
    import traceback
    import types

    os.setpgid(0, 0)  # its own group: what it starts is killed with it
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", closefd=False, buffering=1)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
    os.chdir(request["cwd"])
    env: dict[str, str] = request["env"]
    os.environ.clear()
    os.environ.update(env)
    argv: list[str] = request["argv"]
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in _BASE_PATH if p not in extra]
    threads = env.get("OMP_NUM_THREADS", "")
    code: Any = 0
    try:
        import torch

        if threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[:] = ["", *extra, *base]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)  # noqa: S102
        elif argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[:] = [os.getcwd(), *extra, *base]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(argv[0])
            sys.argv = list(argv)
            sys.path[:] = [os.path.dirname(script), *extra, *base]
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 (the script's own error: printed as python does)
        traceback.print_exc()
        code = 1
    sys.exit(code)


def _serve(address: str) -> None:
    """Import what the runs need, then fork a run per connection. One thread throughout
    (forking is safe); a run whose client went away is killed with its group."""
    import numpy  # noqa: F401
    import torch  # noqa: F401

    own = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    _BASE_PATH[:] = [p for p in sys.path[1:] if p not in own]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    runs: dict[int, socket.socket] = {}  # pid -> its client's connection
    gone: set[int] = set()  # runs killed since their client went away
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    parent = os.getppid()
    while os.getppid() == parent:  # (ends with the pytest worker)
        waiting = [c for p, c in runs.items() if p not in gone]
        ready, _, _ = select.select([listener, *waiting], [], [], 0.05)
        for sock in ready:
            if sock is listener:
                conn, _ = listener.accept()
                data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                while not data.endswith(b"\n"):
                    more = conn.recv(1 << 20)
                    if not more:
                        break
                    data += more
                request = json.loads(data)
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in runs.values():
                        other.close()
                    conn.close()
                    _child(request, fds)
                for fd in fds:
                    os.close(fd)
                conn.sendall(b"%d\n" % pid)
                runs[pid] = conn
            elif not sock.recv(1):  # the client went away: its run goes too
                pid = next(p for p, c in runs.items() if c is sock)
                gone.add(pid)
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
        while runs:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            gone.discard(pid)
            conn = runs.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
                except OSError:
                    pass
                conn.close()
    for pid in runs:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        _serve(sys.argv[2])
    elif sys.argv[1:2] == ["--rank"]:
        _shim(sys.argv[2:])
