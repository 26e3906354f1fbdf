"""Real nodes on one machine: network namespaces joined by a veth pair or a bridge (needs root and ``ip``).

Not a test module: used by tests/test_two_node.py and bench/netns_scale_bench.py (``pythonpath = ["tests"]``).

Each pair gets its own namespaces and interfaces, named from this process's id (unique among concurrent
pytest-xdist workers), the xdist worker id and a counter, and addresses from 198.18.0.0/15 (reserved for
network tests). Everything a pair started is killed and both namespaces are deleted when the ``with``
block ends, also when a test fails. :class:`RankWatch` follows every checker rank inside the namespaces
through /proc, so a test can assert when each rank ended, whichever node it ran on.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TORCHRUN_SH = REPO_ROOT / "launchers" / "torchrun.sh"
PREFIX = "ppck-"
"""Every namespace made here starts with this, then the creating process's id (for stale cleanup)."""
RDZV_PORT = 29400
"""A fixed rendezvous port is safe here, and only here: node 0's namespace is private to one pair, so
nothing else can listen on it (outside a private namespace, tests must use port 0 / FileStore)."""
IP_TIMEOUT_S = 10
WHEELS_DIR = REPO_ROOT.parent / "wheels"
"""Released SGLang wheels (``pip download --no-deps sglang==X -d ../wheels``), for their package metadata."""
# Inherited variables that would change what torchrun or the checker does: a developer's shell or a CI
# runner must not leak them into a test.
_LEAKY = re.compile(
    r"^(PET_|TORCHELASTIC_|SGLANG_|CHECKER_)|^(MASTER_ADDR|MASTER_PORT|RANK|WORLD_SIZE|"
    r"LOCAL_RANK|GROUP_RANK|NNODES|NPROC_PER_NODE|NODE_RANK|RDZV_.*|LOCAL_ADDR|BACKEND|"
    r"JOB_TIMEOUT_S|GLOO_SOCKET_IFNAME|TORCH_ELASTIC_.*)$"
)
_counter = itertools.count()


def release_site(root: Path, version: str) -> Path:
    """A directory that, first on a node's PYTHONPATH, makes SGLang ``version`` the installed release as
    its package metadata tells it (``importlib.metadata``, what the checker reads): the released wheel's
    own ``sglang-X.dist-info`` when ``pip download --no-deps sglang==X -d`` put the wheel in
    :data:`WHEELS_DIR`, else the three lines pip writes at least. No SGLang code comes with it."""
    site = root / f"site-sglang-{version}"
    info = f"sglang-{version}.dist-info/"
    wheels = sorted(WHEELS_DIR.glob(f"sglang-{version}-*.whl"))
    if wheels:
        with zipfile.ZipFile(wheels[0]) as whl:
            whl.extractall(site, members=[n for n in whl.namelist() if n.startswith(info)])
    else:
        (site / info).mkdir(parents=True)
        (site / info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return site


def python_path(*dirs: Path) -> str:
    """PYTHONPATH with ``dirs`` ahead of the inherited one (the first distribution found wins)."""
    inherited = os.environ.get("PYTHONPATH")
    return os.pathsep.join([*map(str, dirs), *([inherited] if inherited else [])])


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=check)


def unavailable_reason() -> str | None:
    """Why two namespaces cannot be made here (None: they can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (run the netns tests as root, e.g. in a CI container)"
    if shutil.which("ip") is None:
        return "no `ip` command (install iproute2)"
    if not Path("/proc/self/ns/net").exists():
        return "this kernel has no network namespaces"
    return None


@dataclass(frozen=True)
class Node:
    index: int
    ns: str
    dev: str
    addr: str
    hostname: str
    """What CHECKER_HOSTNAME reports: namespaces share the machine's hostname."""

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.ns]


@dataclass
class Agent:
    """One launcher (``launchers/torchrun.sh`` in a node's namespace, or a recipe) in its own session."""

    node: Node | None
    proc: subprocess.Popen[bytes]
    log: Path
    started: float
    ended: float | None = None

    def wait(self, timeout_s: float) -> int | None:
        """Exit code, or None after killing it when it outlives ``timeout_s`` (a test then fails)."""
        try:
            code = self.proc.wait(timeout=max(0.1, timeout_s))
        except subprocess.TimeoutExpired:
            _kill_group(self.proc.pid)
            self.proc.wait(timeout=10)
            code = None
        self.ended = self.ended or time.monotonic()
        return code

    @property
    def elapsed_s(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class NodePair:
    """Nodes on one network (two for most tests; :func:`node_group` makes more)."""

    nodes: tuple[Node, ...]
    tag: str
    agents: list[Agent] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"{self.nodes[0].addr}:{RDZV_PORT}"

    def node_env(self, index: int) -> dict[str, str]:
        """What tells a node apart from its twin: its name in reports, its interface for gloo."""
        node = self.nodes[index]
        # gloo picks its interface from the hostname otherwise, which resolves to loopback here.
        return {"GLOO_SOCKET_IFNAME": node.dev, "CHECKER_HOSTNAME": node.hostname}

    def launch(
        self,
        index: int,
        checker_args: list[str],
        *,
        log_dir: Path,
        nproc: int = 2,
        rdzv_conf: str = "join_timeout=30",
        env: Mapping[str, str] | None = None,
    ) -> Agent:
        """Start node ``index``'s agent exactly as a user would: the recipe's knobs, then checker args."""
        node = self.nodes[index]
        knobs = dict(
            NNODES=str(len(self.nodes)),
            NPROC_PER_NODE=str(nproc),
            NODE_RANK=str(index),
            RDZV_ENDPOINT=self.endpoint,
            RDZV_ID=f"pair-{self.tag}",
            LOCAL_ADDR=node.addr,
            BACKEND="gloo",
            RDZV_CONF=rdzv_conf,
            **self.node_env(index),
        )
        return self.spawn(
            [*node.exec_prefix(), "bash", str(TORCHRUN_SH), *checker_args],
            env={**knobs, **(env or {})},
            log=log_dir / f"node{index}.log",
            node=node,
        )

    def spawn(self, cmd: list[str], *, env: Mapping[str, str], log: Path, node: Node | None = None) -> Agent:
        """Start ``cmd`` in its own session with a clean environment plus ``env``; killed at teardown."""
        e = {k: v for k, v in os.environ.items() if not _LEAKY.match(k)}
        e.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        e.update(env)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=REPO_ROOT,
                env=e,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # one process group to kill; torchrun puts each worker in its own
            )
        agent = Agent(node=node, proc=proc, log=log, started=time.monotonic())
        self.agents.append(agent)
        return agent

    def cut_link(self) -> None:
        """Take node 0's end of the veth down: packets between the nodes vanish, nothing errors."""
        _ip("-n", self.nodes[0].ns, "link", "set", self.nodes[0].dev, "down")


def _worker_tag() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


@contextmanager
def node_pair() -> Iterator[NodePair]:
    """Two namespaces joined by a veth pair, 198.18.0.1 and 198.18.0.2; always torn down."""
    with node_group(2) as pair:
        yield pair


@contextmanager
def node_group(count: int) -> Iterator[NodePair]:
    """``count`` namespaces, 198.18.0.1 up: two are joined by one veth pair; more by a veth each into a
    bridge in one more namespace (the switch), as nodes on one rack. Always torn down."""
    remove_stale()
    n = next(_counter)
    pid = os.getpid()
    tag = f"{pid}-{_worker_tag()}-{n}"
    # Interface names are at most 15 characters: "ck" + pid (<= 7 hex) + counter + node.
    short = f"ck{pid:x}{n:x}"[:12]
    nodes = tuple(
        Node(
            index=i,
            ns=f"{PREFIX}{tag}-{i}",
            dev=f"{short}{'ab'[i]}" if count == 2 else f"{short}{i:x}",
            addr=f"198.18.0.{i + 1}",
            hostname=f"node{i}",
        )
        for i in range(count)
    )
    pair = NodePair(nodes=nodes, tag=tag)
    made: list[str] = []
    try:
        for node in nodes:
            _ip("netns", "add", node.ns)
            made.append(node.ns)
        if count == 2:
            # Created directly inside the namespaces: the names never appear in the host's namespace.
            _veth(nodes[0].dev, nodes[0].ns, nodes[1].dev, nodes[1].ns)
        else:
            switch = f"{PREFIX}{tag}-sw"
            _ip("netns", "add", switch)
            made.append(switch)
            _ip("-n", switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", switch, "link", "set", "br0", "up")
            for i, node in enumerate(nodes):
                port = f"sw{i:x}"
                _veth(node.dev, node.ns, port, switch)
                _ip("-n", switch, "link", "set", port, "master", "br0")
                _ip("-n", switch, "link", "set", port, "up")
        for node in nodes:
            _ip("-n", node.ns, "addr", "add", f"{node.addr}/24", "dev", node.dev)
            _ip("-n", node.ns, "link", "set", "lo", "up")
            _ip("-n", node.ns, "link", "set", node.dev, "up")
        # `ip netns exec` also needs to remount /sys: check it works before any test relies on it.
        subprocess.run(
            [*nodes[-1].exec_prefix(), "true"],
            capture_output=True,
            text=True,
            timeout=IP_TIMEOUT_S,
            check=True,
        )
        yield pair
    finally:
        for agent in pair.agents:
            _kill_group(agent.proc.pid)
        for ns in made:
            kill_namespace_processes(ns)
        for agent in pair.agents:
            try:
                agent.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for ns in made:
            _ip("netns", "del", ns, check=False)


def _veth(dev: str, ns: str, peer: str, peer_ns: str) -> None:
    _ip("link", "add", dev, "netns", ns, "type", "veth", "peer", "name", peer, "netns", peer_ns)


def make_error(exc: BaseException) -> str:
    """A skip reason from a failed ``ip`` call (e.g. no CAP_SYS_ADMIN inside a container)."""
    if isinstance(exc, subprocess.CalledProcessError):
        return f"cannot make network namespaces here: {' '.join(exc.cmd)}: {(exc.stderr or '').strip()}"
    return f"cannot make network namespaces here: {exc}"


def remove_stale() -> None:
    """Delete namespaces left by a test process that was killed before its finalizer ran."""
    try:
        names = _ip("netns", "list", check=False).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return
    for name in names:
        m = re.match(rf"{PREFIX}(\d+)-", name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            kill_namespace_processes(name)
            _ip("netns", "del", name, check=False)


def _ns_inode(ns: str) -> int | None:
    try:
        return os.stat(f"/run/netns/{ns}").st_ino
    except OSError:
        return None


def _pids_in(inodes: Mapping[int, int]) -> Iterator[tuple[int, int]]:
    """(pid, node index) of every process whose network namespace is one of ``inodes``."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            ino = os.stat(f"/proc/{entry.name}/ns/net").st_ino
        except OSError:
            continue
        if ino in inodes:
            yield int(entry.name), inodes[ino]


def kill_namespace_processes(ns: str) -> None:
    """SIGKILL what runs inside a namespace this module made (torchrun workers have their own sessions)."""
    ino = _ns_inode(ns)
    if ino is None:
        return
    for pid, _ in list(_pids_in({ino: 0})):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


@dataclass
class RankProc:
    rank: int
    node: int
    pid: int
    seen: float
    """When the watch first saw the process (it polls every ``interval_s``)."""
    run_id: str = ""
    """TORCHELASTIC_RUN_ID: the rendezvous id the launcher passed."""
    ended: float | None = None
    stopped_at: float | None = None
    """When the watch first saw it in state T (SIGSTOPped)."""

    @property
    def lifetime_s(self) -> float | None:
        return None if self.ended is None else self.ended - self.seen


class RankWatch:
    """Follows every checker rank in the pair's namespaces: its pid, global rank, node, and end time.

    A rank has ended when its process is gone or a zombie; a SIGSTOPped rank shows state ``T``.
    """

    def __init__(self, pair: NodePair, *, interval_s: float = 0.1) -> None:
        self.inodes = {_ns_inode(n.ns): n.index for n in pair.nodes}
        self.interval_s = interval_s
        self.ranks: dict[int, RankProc] = {}
        self._pids: dict[int, int | None] = {}  # pid -> rank (None: not a checker rank, yet)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> RankWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _rank_of(self, pid: int) -> tuple[int, str] | None:
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        if b"checker" not in cmd or b"-m" not in cmd:
            return None
        env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
        rank, run_id = env.get(b"RANK"), env.get(b"TORCHELASTIC_RUN_ID")
        return None if rank is None or run_id is None else (int(rank), run_id.decode())

    def poll(self) -> None:
        now = time.monotonic()
        live: set[int] = set()
        for pid, node in _pids_in(self.inodes):
            live.add(pid)
            # Until a pid is known as a rank, look again: torchrun forks before it execs the worker.
            if self._pids.get(pid) is None:
                found = self._rank_of(pid)
                if found is not None:
                    self._pids[pid] = found[0]
                    with self._lock:
                        self.ranks.setdefault(
                            found[0], RankProc(rank=found[0], node=node, pid=pid, seen=now, run_id=found[1])
                        )
                else:
                    self._pids[pid] = None
        with self._lock:
            for rp in self.ranks.values():
                if rp.ended is not None:
                    continue
                state = _state(rp.pid) if rp.pid in live else None
                if state in (None, "Z", "X"):
                    rp.ended = now
                elif state == "T" and rp.stopped_at is None:
                    rp.stopped_at = now

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval_s)

    def wait_until(self, predicate, *, timeout_s: float) -> bool:
        """Poll (bounded) until ``predicate(ranks)`` holds."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if predicate(self.ranks):
                    return True
            time.sleep(self.interval_s)
        return False

    def snapshot(self) -> dict[int, RankProc]:
        with self._lock:
            return dict(self.ranks)
