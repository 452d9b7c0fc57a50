"""The ranks of tests/harness.py's run_ranks(), forked from one process that
has already imported torch and hvdtorch, instead of each paying those
imports (about 2.5 s of CPU per rank, most of a short test on 2 cores).

    python -m tests.fork_server FD    # the server; FD: its end of a socketpair

Protocol (one AF_UNIX SOCK_SEQPACKET message each way, JSON):
  * the server sends {"ready": true, "threads": n} once torch and hvdtorch are
    imported: n is the number of threads this process runs, and a client
    forks nothing unless it is 1 (a fork copies only the forking thread);
  * a request {"id": k, "argv": [...], "env": {...}, "cwd": path} carries, as
    SCM_RIGHTS, the write end of a pipe: the rank's stdout and stderr, as
    Popen(stdout=PIPE, stderr=STDOUT) would give it;
  * the server answers {"id": k, "pid": pid}, and {"pid": pid, "exit": code}
    once the rank is reaped (code as Popen's returncode: -N for signal N).

A forked rank is what `python -m tests.rank_main ARGV` would be, started with
ENV in CWD: its own session (start_new_session=True: killpg(pid) reaches
what it starts), stdin /dev/null, that environment, that argv; it leaves by
a normal interpreter exit (Python's atexit handlers, then the C library's:
the shared-memory segments' cleanup), never os._exit. What differs from a
fresh process is what was done at import time under the server's
environment, so the client forks only for environments that differ from the
server's in what nothing reads at import (HVDTORCH_* knobs and the launch
variables, read at hvd.init()); anything else starts a fresh process. Set
HVDTORCH_TEST_FRESH_RANKS=1 to start every rank fresh.
"""

import json
import os
import select
import socket
import sys

MAX_MESSAGE = 1 << 20


def _send(sock: socket.socket, message: dict) -> None:
    sock.send(json.dumps(message).encode())


def _become_rank(request: dict, out_fd: int) -> int:
    """In the forked child: the rank's process state, then its main."""
    os.setsid()
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(out_fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    from tests import rank_main

    sys.argv = [rank_main.__file__, *request["argv"]]
    return rank_main.main()


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"pid": pid, "exit": os.waitstatus_to_exitcode(status)})


def serve(fd: int) -> int:
    sock = socket.socket(fileno=fd)
    import threading

    import torch  # noqa: F401  (the imports every rank would pay)

    import hvdtorch  # noqa: F401
    from tests import rank_main  # noqa: F401

    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else threading.active_count()
    _send(sock, {"ready": True, "threads": threads})
    while True:
        readable, _, _ = select.select([sock], [], [], 0.02)
        _reap(sock)
        if not readable:
            continue
        data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 1)
        if not data:  # the client is gone; ranks still running finish on their own
            return 0
        request = json.loads(data)
        pid = os.fork()
        if pid == 0:
            sock.close()
            # SystemExit unwinds to the interpreter's own exit: what a fresh rank's end runs, runs.
            raise SystemExit(_become_rank(request, fds[0]))
        os.close(fds[0])
        _send(sock, {"id": request["id"], "pid": pid})


# ---- the client (tests/harness.py) ------------------------------------------------

# What run_ranks sets per rank that nothing reads before hvd.init() (tests/harness.py, hvdtorch/launch.py).
LAUNCH_VARIABLES = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "SLURM_PROCID",
    "PYTEST_CURRENT_TEST",  # pytest's, set per test phase
}


class ForkedRank:
    """The part of Popen's surface run_ranks uses, for a rank the server forked."""

    def __init__(self, server: "ForkServer", pid: int, stdout):
        self._server, self.pid, self.stdout, self.returncode = server, pid, stdout, None

    def poll(self):
        if self.returncode is None:
            self.returncode = self._server.exit_of(self.pid)
        return self.returncode

    def wait(self):
        while self.poll() is None:
            self._server.wait_for_exit(self.pid)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # ended and reaped by the server, not yet reported: as Popen, no error
                pass


class ForkServer:
    """One server per test session, started at the first run_ranks(); close() (at
    exit) ends it. ``usable`` is False where it could not start or runs threads."""

    def __init__(self, env: dict, cwd: str, timeout: float = 300.0):
        import subprocess
        import tempfile
        import threading

        self.env = dict(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fork_server", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=self.env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        theirs.close()
        self._sock = ours
        self._cond = threading.Condition()
        self._pids, self._exits, self._ready, self._dead, self._next = {}, {}, None, False, 0
        threading.Thread(target=self._read, name="fork-server-reader", daemon=True).start()
        with self._cond:
            self._cond.wait_for(lambda: self._ready is not None or self._dead, timeout=timeout)
            self.usable = bool(self._ready) and self._ready.get("threads") == 1
        if not self.usable:
            self.close()

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            with self._cond:
                if not data:
                    self._dead = True
                    self._cond.notify_all()
                    return
                message = json.loads(data)
                if "ready" in message:
                    self._ready = message
                elif "id" in message:
                    self._exits.pop(message["pid"], None)  # a pid the kernel gave an earlier rank too
                    self._pids[message["id"]] = message["pid"]
                else:
                    self._exits[message["pid"]] = message["exit"]
                self._cond.notify_all()

    def can_fork(self, env: dict) -> bool:
        """Whether a rank with ``env`` may be forked: it differs from the server's
        environment only in what is read at hvd.init(), never at import."""
        if not self.usable:
            return False
        for k in self.env.keys() | env.keys():
            if self.env.get(k) != env.get(k) and not k.startswith("HVDTORCH_") and k not in LAUNCH_VARIABLES:
                return False
        return True

    def start(self, argv, env: dict, cwd: str) -> ForkedRank:
        read_end, write_end = os.pipe()
        with self._cond:
            key, self._next = self._next, self._next + 1
        try:
            request = {"id": key, "argv": list(argv), "env": env, "cwd": cwd}
            socket.send_fds(self._sock, [json.dumps(request).encode()], [write_end])
        finally:
            os.close(write_end)
        with self._cond:
            self._cond.wait_for(lambda: key in self._pids or self._dead, timeout=60)
            pid = self._pids.pop(key, None)
        if pid is None:
            os.close(read_end)
            raise RuntimeError("tests/fork_server.py did not fork a rank: " + self.log())
        return ForkedRank(self, pid, os.fdopen(read_end, "rb"))

    def exit_of(self, pid: int):
        with self._cond:
            return self._exits.get(pid)

    def wait_for_exit(self, pid: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or self._dead, timeout=0.5)
            if self._dead and pid not in self._exits:
                raise RuntimeError(f"tests/fork_server.py ended before rank pid {pid} did: " + self.log())

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the reader; the server sees the end and returns
        except OSError:
            pass
        self._sock.close()
        try:
            self._proc.wait(timeout=30)
        except Exception:
            self._proc.kill()
            self._proc.wait()


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
