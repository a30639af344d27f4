"""Real three-node lockd clusters on 127.0.0.1 for the tests, started from the binary named by
``LOCKD_BIN``: :class:`Cluster`, plaintext ``lockd run --insecure`` nodes (the same command line
as tests/src/cluster.rs and docs/NODE_CLI.md describe), and :class:`DevCluster`, ``lockd dev``
in a temporary folder — TLS with the throwaway CA and certificates it mints and prints the
``export`` lines of, client certificates required, as README's "Using it" runs it.

Owns the node processes, their ports, data directories and logs (one temporary directory), and
the readiness checks. No process outlives it: :meth:`Cluster.close` SIGKILLs and reaps every
node, and each node is started with ``PR_SET_PDEATHSIG`` so that it dies with the test process
even if that is killed outright. Waits are for conditions, with generous bounds.
"""

from __future__ import annotations

import ctypes
import os
import random
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, TypeVar

import grpc

from lockd.v1 import admin_pb2, admin_pb2_grpc

T = TypeVar("T")

#: The environment variable naming the lockd binary.
ENV_BIN = "LOCKD_BIN"
#: The line a node prints on stdout once it serves (docs/NODE_CLI.md "What a node prints").
READY_LINE_PREFIX = "lockd ready"
#: How long a node may take to print its ready line, and the cluster to agree on a leader.
START_TIMEOUT = 60.0
#: How long a new leader may take after a kill (an election on a loaded two-core machine).
LEADER_TIMEOUT = 30.0
#: Raft timing of the test nodes, as the Rust harness's (tests/src/config.rs).
HEARTBEAT_INTERVAL_MS = 150
ELECTION_TIMEOUT_MIN_MS = 450
ELECTION_TIMEOUT_MAX_MS = 900
#: How many times a start is retried with fresh ports when a node loses its port to a race.
SPAWN_ATTEMPTS = 3
#: Log lines per node printed when a test failed.
TAIL_LINES = 40

_PR_SET_PDEATHSIG = 1


def lockd_binary() -> str:
    """The lockd binary to test; raises naming how to get one if ``LOCKD_BIN`` is not set."""
    path = os.environ.get(ENV_BIN)
    if not path:
        raise RuntimeError(
            f"{ENV_BIN} is not set: build lockd with `cargo build -p lockd` and set "
            f"{ENV_BIN}=<target dir>/debug/lockd"
        )
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{ENV_BIN}={path} is not an executable file")
    return path


def wait_for(what: str, condition: Callable[[], Optional[T]], timeout: float, pause: float = 0.05) -> T:
    """Polls ``condition`` until it returns something true and returns that; raises
    ``AssertionError`` naming ``what`` after ``timeout`` seconds."""
    give_up = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= give_up:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(pause)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    # A node must not outlive a test process that was killed without running its finalizers.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Cluster:
    """Three ``lockd run`` processes forming one cluster (see the module docstring)."""

    def __init__(self, nodes: int = 3) -> None:
        self.binary = lockd_binary()
        self._tmp = tempfile.TemporaryDirectory(prefix="lockd-pytest-")
        self.dir = Path(self._tmp.name)
        self.ids = list(range(1, nodes + 1))
        self.name = f"pytest-{os.getpid()}-{int(time.time() * 1000) % 100000}"
        self._procs: Dict[int, subprocess.Popen] = {}
        self.addrs: Dict[int, str] = {}
        try:
            for attempt in range(SPAWN_ATTEMPTS):
                if self._try_start(attempt):
                    break
            else:
                raise AssertionError(f"could not start the cluster:\n{self.log_tails()}")
            self.wait_for_leader()
        except BaseException:
            self.close()
            raise

    def _try_start(self, attempt: int) -> bool:
        self._kill_all()
        self.addrs = {i: f"127.0.0.1:{_free_port()}" for i in self.ids}
        peers = ",".join(f"{i}={a}" for i, a in self.addrs.items())
        for node in self.ids:
            data = self.dir / f"try{attempt}" / f"node{node}"
            data.mkdir(parents=True, exist_ok=True)
            args = [
                self.binary, "run",
                "--node-id", str(node),
                "--listen", self.addrs[node],
                "--data-dir", str(data),
                "--peers", peers,
                "--cluster-name", self.name,
                "--heartbeat-interval-ms", str(HEARTBEAT_INTERVAL_MS),
                "--election-timeout-min-ms", str(ELECTION_TIMEOUT_MIN_MS),
                "--election-timeout-max-ms", str(ELECTION_TIMEOUT_MAX_MS),
                "--worker-threads", "1",
                # Plaintext: this cluster is for the tests of everything but TLS, which
                # DevCluster serves (lockd run refuses plaintext unless told so).
                "--insecure",
            ]
            if node == 1:
                args.append("--bootstrap")
            self._procs[node] = subprocess.Popen(
                args,
                stdout=open(self._stdout(node), "w"),
                stderr=open(self._log(node), "w"),
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        give_up = time.monotonic() + START_TIMEOUT
        for node in self.ids:
            while True:
                if READY_LINE_PREFIX in self._stdout(node).read_text():
                    break
                if self._procs[node].poll() is not None:
                    return False  # Most likely its port was taken meanwhile: fresh ports.
                if time.monotonic() >= give_up:
                    raise AssertionError(f"node {node} printed no ready line:\n{self.log_tails()}")
                time.sleep(0.05)
        return True

    def _stdout(self, node: int) -> Path:
        return self.dir / f"node{node}.stdout"

    def _log(self, node: int) -> Path:
        return self.dir / f"node{node}.log"

    # ---- addresses and status ----------------------------------------------------------

    def endpoints(self, nodes: Optional[List[int]] = None) -> List[str]:
        """``host:port`` of the given nodes (default: all)."""
        return [self.addrs[i] for i in (nodes or self.ids)]

    def live(self) -> List[int]:
        """The nodes whose process is running."""
        return [i for i, p in self._procs.items() if p.poll() is None]

    def status(self, node: int, timeout: float = 3.0) -> Optional[admin_pb2.StatusResponse]:
        """Node ``node``'s own view of the cluster, or ``None`` if it did not answer."""
        with grpc.insecure_channel(self.addrs[node], options=[("grpc.enable_http_proxy", 0)]) as channel:
            try:
                return admin_pb2_grpc.AdminServiceStub(channel).Status(
                    admin_pb2.StatusRequest(), timeout=timeout
                )
            except grpc.RpcError:
                return None

    def _agreed_leader(self) -> Optional[int]:
        leaders = set()
        for node in self.live():
            status = self.status(node)
            if status is None or not status.HasField("leader_id"):
                return None
            leaders.add(status.leader_id)
        if len(leaders) == 1:
            leader = leaders.pop()
            return leader if leader in self.live() else None
        return None

    def wait_for_leader(self, timeout: float = LEADER_TIMEOUT) -> int:
        """The leader every live node agrees on, waiting up to ``timeout`` seconds."""
        return wait_for("an agreed leader", self._agreed_leader, timeout, pause=0.1)

    def followers(self) -> List[int]:
        """The live nodes other than the agreed leader."""
        leader = self.wait_for_leader()
        return [i for i in self.live() if i != leader]

    # ---- process control -----------------------------------------------------------------

    def kill(self, node: int) -> None:
        """SIGKILLs node ``node`` and reaps it."""
        proc = self._procs[node]
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)

    def _kill_all(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self._procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()

    def log_tails(self) -> str:
        """The last lines of every node's stderr log."""
        parts = []
        for node in self.ids:
            path = self._log(node)
            lines = path.read_text(errors="replace").splitlines()[-TAIL_LINES:] if path.exists() else []
            parts.append(f"---- node {node} ({self.addrs.get(node)}) ----\n" + "\n".join(lines))
        return "\n".join(parts)

    def close(self) -> None:
        """Kills every node and removes the directory."""
        self._kill_all()
        self._tmp.cleanup()


#: ``export NAME=VALUE`` pairs as ``lockd dev`` prints them (several on one line).
_EXPORT = re.compile(r"(LOCKD_[A-Z_]+)=(\S+)")
#: The line ``lockd dev`` prints once every node serves and the leader is known.
DEV_READY_PREFIX = "leader: node "
#: Nodes of ``lockd dev``.
DEV_NODES = 3
#: How long ``lockd dev`` may take to stop its nodes after SIGTERM.
DEV_STOP_TIMEOUT = 30.0


def _free_port_run(count: int) -> int:
    """A port ``p`` such that ``p .. p+count-1`` were all free just now (``lockd dev`` takes
    ``--base-port`` and the next two)."""
    for _ in range(100):
        base = random.randint(20000, 60000)
        socks = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise AssertionError(f"no run of {count} free ports found")


class DevCluster:
    """``lockd dev --dir <tmp> --base-port <free>``: three nodes with TLS, as a user starts them.

    :attr:`exports` holds the variables its ``export`` lines set (``LOCKD_ENDPOINTS``,
    ``LOCKD_CA``, ``LOCKD_CERT``, ``LOCKD_KEY`` — the ``client``'s certificate); :attr:`tls_dir`
    the folder of every certificate (``operator.pem``, ``admin.pem`` beside the client's).
    """

    def __init__(self) -> None:
        self.binary = lockd_binary()
        self._tmp = tempfile.TemporaryDirectory(prefix="lockd-pytest-dev-")
        self.dir = Path(self._tmp.name)
        self._proc: Optional[subprocess.Popen] = None
        self.exports: Dict[str, str] = {}
        try:
            for attempt in range(SPAWN_ATTEMPTS):
                if self._try_start(attempt):
                    break
            else:
                raise AssertionError(f"lockd dev did not start:\n{self.log_tail()}")
        except BaseException:
            self.close()
            raise

    def _try_start(self, attempt: int) -> bool:
        self._stop()
        base = _free_port_run(DEV_NODES)
        self.dev_dir = self.dir / f"dev{attempt}"
        self._stdout_path = self.dir / f"dev{attempt}.stdout"
        self._stderr_path = self.dir / f"dev{attempt}.stderr"
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKD_")}
        self._proc = subprocess.Popen(
            [self.binary, "dev", "--dir", str(self.dev_dir), "--base-port", str(base)],
            stdout=open(self._stdout_path, "w"),
            stderr=open(self._stderr_path, "w"),
            stdin=subprocess.DEVNULL,
            env=env,
            # Its own process group, so close() reaches the nodes it started too.
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        give_up = time.monotonic() + START_TIMEOUT
        while True:
            out = self._stdout_path.read_text()
            if DEV_READY_PREFIX in out and "LOCKD_KEY=" in out:
                self.exports = dict(_EXPORT.findall(_first_exports(out)))
                return True
            if self._proc.poll() is not None:
                return False  # Most likely a port was taken meanwhile: other ports.
            if time.monotonic() >= give_up:
                raise AssertionError(f"lockd dev printed no leader line:\n{self.log_tail()}")
            time.sleep(0.05)

    @property
    def tls_dir(self) -> Path:
        """The folder of the CA and every certificate ``lockd dev`` minted."""
        return Path(self.exports["LOCKD_CA"]).parent

    def endpoints(self) -> List[str]:
        """``host:port`` of every node, from the ``LOCKD_ENDPOINTS`` export line."""
        return self.exports["LOCKD_ENDPOINTS"].split(",")

    def identity(self, name: str) -> Tuple[str, str]:
        """The certificate and key files of ``name`` (``client``, ``operator``, ``admin``)."""
        return str(self.tls_dir / f"{name}.pem"), str(self.tls_dir / f"{name}-key.pem")

    def log_tail(self) -> str:
        """The end of ``lockd dev``'s output and of every node's log."""
        parts = []
        for path in [getattr(self, "_stdout_path", None), getattr(self, "_stderr_path", None)]:
            if path is not None and path.exists():
                lines = path.read_text(errors="replace").splitlines()[-TAIL_LINES:]
                parts.append(f"---- {path.name} ----\n" + "\n".join(lines))
        for node in range(1, DEV_NODES + 1):
            path = getattr(self, "dev_dir", self.dir) / f"node{node}.log"
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-TAIL_LINES:]
                parts.append(f"---- node {node} ----\n" + "\n".join(lines))
        return "\n".join(parts)

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        # SIGTERM: lockd dev stops its nodes and exits. They run in process groups of their
        # own, so a signal to lockd dev's group alone would leave them running.
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=DEV_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        for pid in self._node_pids():
            try:
                os.kill(pid, signal.SIGKILL)  # only if lockd dev could not stop it
            except ProcessLookupError:
                pass

    def _node_pids(self) -> List[int]:
        """Processes still running a node of this dev folder (none after a clean stop)."""
        pids = []
        marker = str(getattr(self, "dev_dir", self.dir)).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"lockd" in cmdline and marker in cmdline and int(entry.name) != os.getpid():
                pids.append(int(entry.name))
        return pids

    def close(self) -> None:
        """Kills ``lockd dev`` and its nodes and removes the folder."""
        self._stop()
        self._tmp.cleanup()


def _first_exports(out: str) -> str:
    """The ``export`` lines of ``lockd dev``'s output that are not comments (the operator's and
    admin's lines start with ``#``)."""
    return "\n".join(
        line for line in out.splitlines() if line.strip().startswith("export ")
    )
