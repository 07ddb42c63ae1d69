"""`port doctor --cluster RECIPE`: catch a bad cluster before step 1.

Checks, each one row (ok / warn / fail / info) with what was found and how to fix it:

* **ports**: the master port is free on the master node (a previous job may still hold it);
* **master**: the master address resolves and answers (a refused connection still proves the host is
  there; a timeout or no route does not);
* **rank table**: the recipe's ``cluster.rank_table_file`` (or ``--rank-table``) passes every documented
  rule and agrees with ``cluster.nodes`` x ``cluster.devices_per_node``;
* **stale processes**: training processes (msrun, torchrun, `port train`) left running hold devices
  and ports (the EJ0001 case);
* **env fingerprint**: each node writes its HCCL/Ascend knobs and versions to a shared directory;
  node 0 compares them (a knob that differs between nodes makes timeouts and links disagree);
* **smoke all-reduce**: msrun runs one real AllReduce with a short timeout; a failure is diagnosed by
  `port diagnose` (issue 12's grammar and verdict).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from model_zoo.files import read_json_object, write_atomic
from porting.diagnostics import DiagnosticsError

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"
STALE_LAUNCHERS = ("msrun", "torchrun")   # argv[0] of a launcher
STALE_SEQUENCES = (("porting", "train"), ("port", "train"), ("-m", "torch.distributed.run"))
FINGERPRINT_PREFIXES = ("HCCL_", "ASCEND_", "MS_", "GLOG_")
FINGERPRINT_IGNORED = ("MS_NODE_ID", "MS_ROLE", "MS_WORKER_NUM", "MS_SCHED_HOST", "MS_SCHED_PORT")


def _row(check: str, status: str, detail: str) -> dict:
    return {"check": check, "status": status, "detail": detail}


def _is_local(addr: str) -> bool:
    try:
        ip = socket.gethostbyname(addr)
    except OSError:
        return False
    if ip.startswith("127.") or ip == "0.0.0.0":
        return True
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def check_port_free(port: int, host: str = "0.0.0.0") -> dict:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as a server binds it: a listener still holding the port fails, a closed connection's TIME_WAIT
        # (left by the previous job on this port) does not
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return _row("master port", FAIL, f"port {port} is in use on this host ({e.strerror}): a previous job or "
                                             f"another service holds it; stop it or set cluster.master_port")
    return _row("master port", OK, f"port {port} is free")


def check_master_reachable(addr: str, port: int, timeout_s: float = 3.0) -> dict:
    try:
        ip = socket.gethostbyname(addr)
    except OSError as e:
        return _row("master address", FAIL, f"{addr} does not resolve ({e}); set cluster.master_addr to node 0's "
                                            f"address as every node sees it")
    try:
        with socket.create_connection((ip, port), timeout=timeout_s):
            pass
    except ConnectionRefusedError:
        return _row("master address", OK, f"{addr} ({ip}) answers (port {port} refused: nothing listens yet)")
    except OSError as e:
        return _row("master address", FAIL, f"{addr}:{port} unreachable ({e.strerror or e}) within {timeout_s:.0f} s; "
                                            f"check the route and firewall from this node to node 0")
    return _row("master address", OK, f"{addr}:{port} ({ip}) is reachable")


def check_rank_table(path: str | None, nodes: int, per_node: int) -> dict:
    if not path:
        return _row("rank table", INFO, "no rank table (msrun dynamic networking)")
    from porting.cluster import ranktable

    try:
        errs = ranktable.errors_of(ranktable.check(ranktable.load(path), nodes=nodes, cards_per_node=per_node))
    except DiagnosticsError as e:
        return _row("rank table", FAIL, str(e))
    if errs:
        return _row("rank table", FAIL, f"{path}: {len(errs)} error(s); first: {errs[0].where}: {errs[0].message}")
    return _row("rank table", OK, f"{path}: every documented rule holds for {nodes} node(s) x {per_node} device(s)")


def stale_processes(own: set[int] | None = None) -> list[tuple[int, str]]:
    """(pid, command line) of training processes other than this one and its ancestors."""
    own = set(own or ()) | _ancestors()
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) in own:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        if _is_training(argv):
            found.append((int(entry.name), " ".join(argv).strip()[:160]))
    return sorted(found)


def _is_training(argv: list[str]) -> bool:
    """A launcher (msrun, torchrun) or a `port train` / torch.distributed.run process, by its argv."""
    if not argv or not argv[0]:
        return False
    if os.path.basename(argv[0]) in STALE_LAUNCHERS or any(os.path.basename(a) in STALE_LAUNCHERS for a in argv[1:2]):
        return True
    names = [os.path.basename(a) for a in argv]
    return any(tuple(names[i:i + len(seq)]) == seq for seq in STALE_SEQUENCES for i in range(len(names)))


def _ancestors() -> set[int]:
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def check_stale() -> dict:
    procs = stale_processes()
    if not procs:
        return _row("stale processes", OK, "no training process (msrun, torchrun, port train) is running")
    listing = "; ".join(f"pid {p}: {c}" for p, c in procs[:4])
    return _row("stale processes", FAIL, f"{len(procs)} training process(es) still running, holding devices and ports "
                                         f"(HCCP then fails with EJ0001): {listing}; stop them (kill PID) first")


def fingerprint(environ: dict[str, str] | None = None) -> dict:
    """This node's HCCL/Ascend/MindSpore knobs and versions (what must agree across nodes)."""
    from porting import env

    environ = os.environ if environ is None else environ
    knobs = {k: v for k, v in sorted(environ.items())
             if k.startswith(FINGERPRINT_PREFIXES) and k not in FINGERPRINT_IGNORED}
    v = env.versions()
    return {"host": socket.gethostname(), "knobs": knobs,
            "versions": {"python": v.get("python"), "cann": v.get("cann"), **v.get("packages", {})}}


def write_fingerprint(directory: Path, node_rank: int, fp: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"node_{node_rank}.json"
    write_atomic(path, json.dumps(fp, indent=2, sort_keys=True), error=DiagnosticsError)
    return path


def compare_fingerprints(directory: Path, nodes: int) -> dict:
    prints = {}
    for n in range(nodes):
        p = directory / f"node_{n}.json"
        if p.is_file():
            prints[n] = read_json_object(p, what="node fingerprint", error=DiagnosticsError)
    missing = [n for n in range(nodes) if n not in prints]
    if missing:
        return _row("env fingerprint", WARN, f"no fingerprint yet from node(s) {missing} in {directory}; run "
                                             f"`port doctor --cluster` on every node with the same --fingerprint-dir")
    ref = prints[0]
    diffs = []
    for n, fp in prints.items():
        for section in ("knobs", "versions"):
            keys = set(ref.get(section, {})) | set(fp.get(section, {}))
            for k in sorted(keys):
                a, b = ref.get(section, {}).get(k), fp.get(section, {}).get(k)
                if a != b:
                    diffs.append(f"{k}: node 0 {a!r}, node {n} {b!r}")
    if diffs:
        return _row("env fingerprint", FAIL, f"{len(diffs)} difference(s) between nodes: " + "; ".join(diffs[:6])
                    + "; set the same values on every node")
    return _row("env fingerprint", OK, f"{len(prints)} node(s) agree on {len(ref.get('knobs', {}))} knob(s) and versions")


def smoke_allreduce(workers: int, port: int, timeout_s: float = 60.0, device: str = "CPU") -> dict:
    """msrun runs one real AllReduce on ``workers`` local workers; a failure comes with a diagnosis."""
    msrun = shutil.which("msrun", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    if msrun is None:
        return _row("smoke all-reduce", FAIL, "msrun not found (it comes with mindspore); pip install mindspore")
    logdir = Path(tempfile.mkdtemp(prefix="port_smoke_"))
    env = dict(os.environ, MS_CPU_COMM_OP_TIMEOUT="10", MS_NODE_TIMEOUT="10")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    cmd = [msrun, f"--worker_num={workers}", f"--local_worker_num={workers}", f"--master_port={port}",
           f"--log_dir={logdir}", "--join=True", f"--cluster_time_out={int(timeout_s)}",
           str(Path(__file__).with_name("smoke_allreduce.py")), device]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s + 30,
                              start_new_session=True)
        ok = proc.returncode == 0 and all(
            "smoke all-reduce ok" in (logdir / f"worker_{r}.log").read_text(errors="replace")
            for r in range(workers) if (logdir / f"worker_{r}.log").is_file())
    except subprocess.TimeoutExpired:
        ok = False
    if ok:
        shutil.rmtree(logdir, ignore_errors=True)
        return _row("smoke all-reduce", OK, f"{workers} worker(s) under msrun agreed on one AllReduce")
    from porting.diagnostics.diagnose import diagnose

    try:
        d = diagnose(logdir, jobs=1, world_size=workers)
        why = f"rank {d['first_failing_rank']}: {d['reason'][:200]}"
    except DiagnosticsError as e:
        why = str(e)
    return _row("smoke all-reduce", FAIL, f"the AllReduce under msrun failed; diagnosis: {why} (logs: {logdir})")


def run_preflight(recipe_path: str | os.PathLike, *, node_rank: int = 0, fingerprint_dir: Path | None = None,
                  rank_table: str | None = None, smoke: bool = True, overrides: list[str] | None = None) -> dict:
    """Every check for this node; ``ok`` is False when one fails."""
    from porting.train.recipe import load_recipe

    recipe = load_recipe(recipe_path, overrides, check_files=False)
    c = recipe.cluster
    rows = []
    master_here = _is_local(c.master_addr)
    if master_here:
        rows.append(check_port_free(c.master_port))
    else:
        rows.append(check_master_reachable(c.master_addr, c.master_port))
    rows.append(check_rank_table(rank_table or c.rank_table_file, c.nodes, c.devices_per_node))
    rows.append(check_stale())
    if fingerprint_dir is not None:
        write_fingerprint(fingerprint_dir, node_rank, fingerprint())
        rows.append(compare_fingerprints(fingerprint_dir, c.nodes) if node_rank == 0 else
                    _row("env fingerprint", INFO, f"written to {fingerprint_dir}/node_{node_rank}.json; node 0 compares"))
    else:
        rows.append(_row("env fingerprint", INFO, "pass --fingerprint-dir SHARED_DIR on every node to compare knobs"))
    if smoke and rows[0]["status"] != FAIL and master_here:
        workers = min(2, c.devices_per_node) if c.device == "cpu" else c.devices_per_node
        port = _free_port()
        rows.append(smoke_allreduce(max(workers, 2), port, device="CPU" if c.device == "cpu" else "Ascend"))
    elif smoke:
        rows.append(_row("smoke all-reduce", INFO, "run on the master node (or fix the rows above first)"))
    return {"recipe": str(recipe_path), "node_rank": node_rank, "master": f"{c.master_addr}:{c.master_port}",
            "world_size": recipe.world_size, "checks": rows, "ok": not any(r["status"] == FAIL for r in rows)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render_preflight(rep: dict) -> str:
    out = [f"port doctor --cluster {rep['recipe']}: node {rep['node_rank']}, master {rep['master']}, "
           f"world size {rep['world_size']}"]
    out += [f"  [{r['status']:>4}] {r['check']:<18} {r['detail']}" for r in rep["checks"]]
    out.append("result: " + ("ok" if rep["ok"] else "problems found (see [fail] above)"))
    return "\n".join(out)
