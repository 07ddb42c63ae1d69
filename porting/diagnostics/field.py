"""The grammar of field logs: what users paste from torch_npu / torchrun, CANN plogs, HCCL and
MindSpore jobs, beyond `port train`'s own logs.

Each :data:`FIELD_RULES` entry recognises one failure message, names its kind and whether it is a
cause or a consequence, and says how to fix it. :func:`line_facts` pulls what a line tells about
who is involved: the reporting rank (``[Rank 3]``, ``RankID:101``, ``[rank3]:``), the watchdog's
``SeqNum`` and op, the remote rank / group / rankSize of EI0002/EI0006, the HCCL ``Cluster
Exception Location``, a socket peer address, and torchrun's exit codes. Sources of every pattern:
the fixture corpus in ``tests/diagnostics/fixtures/field/`` (each file names its public thread).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from porting.diagnostics.links import link_facts


class FieldRule(NamedTuple):
    pattern: re.Pattern
    kind: str
    role: str
    label: str
    fix: str


FIELD_RULES: tuple[FieldRule, ...] = (
    FieldRule(re.compile(rb"Watchdog caught collective operation timeout"), "comm_timeout", "consequence",
              "torch_npu/torch watchdog: a collective timed out (this rank waited for a peer)",
              "compare SeqNum across ranks: the rank with the lowest SeqNum is behind (it never entered "
              "the collective the others wait in); read that rank's log and plog"),
    FieldRule(re.compile(rb"fftsplus task timeout"), "comm_timeout", "consequence",
              "HCCL task (fftsplus) timed out waiting on a notify: a peer never reached the collective",
              "find the rank that did not arrive (no timeout of its own, or an earlier error); collect every "
              "rank's plog (~/ascend/log/debug/plog) and set HCCL_ENTRY_LOG_ENABLE=1 to log collective entries"),
    FieldRule(re.compile(rb"notify wait timeout occurred", re.I), "comm_timeout", "consequence",
              "notify wait timed out on the device: a peer never sent its notify",
              "look for the rank that stopped first (earlier error, or no error); raise HCCL_EXEC_TIMEOUT only "
              "when every rank is slow"),
    FieldRule(re.compile(rb"AclrtSynchronizeDeviceWithTimeout|error code is 507048|"
                         rb"The execution of the internal task times out", re.I), "comm_timeout", "consequence",
              "stream synchronisation timed out (507048): a task on the device never finished",
              "the device log of this rank names the task; when it is a collective, another rank stopped first"),
    FieldRule(re.compile(rb"Cluster Exception Location"), "comm_fault_report", "consequence",
              "HCCL heartbeat report: it names the faulty rank",
              "read the named rank's log first: ExceptionType says whether its process exited or its network "
              "went down"),
    FieldRule(re.compile(rb"client socket has (?:timed out|failed to connect)|Socket Timeout|"
                         rb"wait socket establish timeout|Getting socket times out|connect[^\n]{0,40}timed? ?out|"
                         rb"waitForInput: socket [^\n]{0,200}timed out",
                         re.I), "comm_timeout", "consequence",
              "socket/connect timeout: the peer never answered",
              "check the named peer is up and reachable (MASTER_ADDR/MASTER_PORT, firewall, HCCL_IF_IP); "
              "with HCCL raise HCCL_CONNECT_TIMEOUT only if start-up is slow"),
    FieldRule(re.compile(rb"listen on ip\[[^\]]*\] and specific port\[\d+\] fail|address already in use|"
                         rb"have already been bound", re.I), "config", "cause",
              "a port is already in use on this host",
              "a previous job still holds the port: kill stale training processes or pick another port"),
    FieldRule(re.compile(rb"NPU out of memory|OutOfMemoryError|Memory_Allocation_Failure|"
                         rb"is more than total mem size|Memory malloc failed|Call rtMalloc fail", re.I),
              "oom", "cause", "out of device memory",
              "lower micro-batch or sequence length, enable recompute or optimizer sharding; torch_npu: "
              "PYTORCH_NPU_ALLOC_CONF=expandable_segments:True; MindSpore: check MS_ALLOC_CONF"),
    FieldRule(re.compile(rb"exitcode\s*:\s*-9\b|Signal 9 \(SIGKILL\)"), "crash", "cause",
              "worker killed with SIGKILL (often the host's OOM killer)",
              "check `dmesg` for the OOM killer on that host; lower host memory use (dataloader workers, "
              "pinned memory)"),
    FieldRule(re.compile(rb"exitcode\s*:\s*-15\b|Signal 15 \(SIGTERM\)|closing signal SIGTERM"), "cluster_abort",
              "consequence", "worker stopped by the launcher after another one failed",
              "look at the launcher's 'Root Cause (first observed failure)' rank"),
    FieldRule(re.compile(rb"failed \(exitcode: -?\d+\) local_rank|ChildFailedError|Root Cause \(first observed"),
              "worker_exit", "cause", "torchrun: a worker exited with an error",
              "read the failing rank's own output above (its traceback) for the reason"),
    FieldRule(re.compile(rb"Worker process \d+ exit with exception|Scheduler process \d+ exit with exception"),
              "worker_exit", "cause", "msrun: a worker process exited with an exception",
              "read that worker's worker_<rank>.log (msrun --log_dir) for its traceback"),
)

# In every HCCL communicator set-up line (COMM_INIT_RES): the scanner's error pass finds these lines
# too, and reads them before it checks the level (they are INFO lines), so they cost no pass of their own.
COMM_INIT_LITERAL = b"CommInit"

# Literals that mark a field-log line worth classifying, added to the scanner's prefilter. Each starts
# with an upper-case letter or a rare character, so the engine's first-character filter still skips
# most bytes (lower-case starts cost 3x the CPU on the 4,096-rank benchmark, measured). Lines these
# miss carry "ERR"/"Error" already: CANN "[ERROR]" lines, "...TimeoutErrorInfo]" device lines.
FIELD_LITERALS = (b"Watchdog caught", b"Socket Timeout", b"[c10d]", b"(exitcode", b"Signal 9", b"Root Cause",
                  b"Memory_Allocation", b"EI0", b"EJ0", b"EE", b"EL0", b"E39", b"EH9", COMM_INIT_LITERAL,
                  # markerless fault texts of the cause model: no [ERROR] prefix on these lines
                  # ("(chipId" for "The error from device(chipId:N": a "T" literal costs at every ISO timestamp)
                  b"NPU out of", b"Device[", b"(chipId", b"[LOST]", b"Heartbeat", b"Check failed",
                  b"Received a dump", b"NCCL work",
                  # the cause taxonomy's texts printed without an error marker (environment, operator build,
                  # host memory, data pipeline, framework internals); "EZ" also takes EZ3003 and EZ1001
                  b"EZ", b"DrvMng", b"Load dynamic library", b"Failed to compile", b"] is null", b"Worker timed out",
                  b"DefaultCPUAllocator", b"CANN version", b"CCL watchdog thread", b"Failing at address",
                  b"Failed to load",
                  # the device's exception dump ("DEVICE[0] PID[415]:"), MindSpore's "Can not find any available kernel
                  # info for: Op", msrun's "Time out nodes are ['3']"
                  # (msrun's "Time out nodes are ['3']" is an ERROR line: "ERR" finds it; a "T" literal would cost at
                  # every ISO timestamp, a new first byte at every filter hit: measured 0.3 ms per 1.15 MB log each)
                  b"DEVICE[", b"Can not find any available kernel",
                  # Ray's memory monitor ("Ray killed this worker") and absl's signal handler ("*** SIGSEGV received")
                  b"Ray killed", b"SIGSEGV", b"SIGABRT")

REPORTER_RES = (
    re.compile(rb"\[(?:PG [^\]]*?)?Rank (\d{1,9})(?!\d)\]"),                # torch watchdog "[Rank 1]"
    re.compile(rb"RankID:(\d{1,9})(?!\d)\)"),                               # torch_npu "(PID:2969, Device:0, RankID:101)"
    re.compile(rb"\[rank(\d{1,9})(?!\d)\]:"),                               # torchrun prefixes
)
SEQ_RE = re.compile(rb"Work[HN]CCL\(SeqNum=(\d{1,9})(?!\d), OpType=(\w+)")
UNKNOWN_RANK = b"4294967295"
REMOTE_RE = re.compile(rb"remote rank\s*:\s*\[\s*(\d{1,9}(?!\d)|unknown)\s*\]", re.I)
GROUP_RE = re.compile(rb"group:\[([^\]]+)\]")
RANK_SIZE_RE = re.compile(rb"rankSize\[(\d{1,9})(?!\d)\]")
# CANN 9's run-log heartbeat line (hcclug_000055): the crimer's address and rank, and the informer's rank
CRIMER_RE = re.compile(rb"crimer rank ?\[([^/\]\s]*)/(\d{1,9})(?!\d)\][^\n]*?(?:by informer rank ?\[[^/\]\s]*/(\d{1,9})(?!\d)\])?")
LOCATION_RE = re.compile(rb"Cluster Exception Location\[IP/ID\]:\[([^/\]]*)/(\d{1,9})(?!\d)\][^\n]*?"
                         rb"(?:Discoverer:\[([^/\]]*)/(\d{1,9})(?!\d)\])?[^\n]*?ExceptionType:\[([^\]]+)\]")
PEER_RES = (
    re.compile(rb"trying to connect to \(([^,\s)]+), (\d{1,9})(?!\d)\)"),            # c10d TCPStore
    re.compile(rb"trying to connect to ([0-9a-fA-F.:]+?):(\d{1,9})(?!\d)\b"),          # c10d rendezvous (host:port)
    re.compile(rb"failed to connect to \[?(?:::ffff:)?([0-9a-fA-F.:x*]+?)\]?:(\d{1,9})(?!\d)"),
    re.compile(rb"remote IP\[?:?\s*\[?([0-9.]+)\]?", re.I),
    re.compile(rb"waitForInput: socket [^\n]{0,160}?remote=\[(?:::ffff:)?([0-9a-fA-F.:]+?)\]:(\d{1,9})(?!\d)"),  # TCPStore read
)
TORCHRUN_ROOT_RE = re.compile(rb"rank\s*:\s*(\d{1,9})(?!\d) \(local_rank: (\d{1,9})(?!\d)\)")
# torch elastic's exit line names only the node-local rank: "failed (exitcode: -9) local_rank: 3 (pid: 407727)"
LOCAL_RANK_RE = re.compile(rb"\blocal_rank: (\d{1,9})(?!\d) \(pid: \d+\)")
# How the launch was laid out, when the pasted text shows it: the torchrun/msrun command line, or
# torch elastic's "Rendezvous complete for workers" block (group_rank=N, local_world_size=M).
NODE_RANK_RE = re.compile(rb"(?:--node[_-]rank[= ]|\bgroup_rank=)(\d{1,9})(?!\d)")
NPROC_RE = re.compile(rb"(?:--nproc[_-]per[_-]node[= ]|--local_worker_num[= ]|\blocal_world_size=)(\d{1,9})(?!\d)")
# HCCL communicator set-up lines of a CANN plog, as MindCluster FaultDiag (ascend_fd's plog parser)
# documents them: "[HCCL_TRACE]HcclCommInitRootInfo success,take time [..]us, rankNum[S], rank[N],
# rootInfo identifier[G], ..." and (CANN 8) "hcclCommInitInfo:commId[G], rank[N], totalRanks[S], ...":
# this process is rank N of group G.
COMM_INIT_RES = (
    re.compile(rb"CommInitRootInfo success[^\n]{0,120}?rankNum\[(?P<size>\d{1,9})(?!\d)\], ?rank\[(?P<rank>\d{1,9})(?!\d)\]"
               rb"[^\n]{0,40}?identifier ?\[(?P<group>[^\]\n]{1,128})\]"),
    re.compile(rb"hcclCommInitInfo:commId\[(?P<group>[^\]\n]{1,128})\], ?rank\[(?P<rank>\d{1,9})(?!\d)\], ?totalRanks\[(?P<size>\d{1,9})(?!\d)\]"),
)
WORLD_GROUPS = ("hccl_world_group",)   # MindSpore's GlobalComm.WORLD_COMM_GROUP on Ascend


def launch_layout(head: bytes) -> dict:
    """node_rank / nproc_per_node when the text shows them (first mention of each). The regexes run
    only where a literal of theirs occurs: on a 64 KiB head they cost 1.5 ms, the literals 0.1 ms."""
    out = {}
    if (any(x in head for x in (b"node_rank", b"node-rank", b"group_rank=")) and
            (m := NODE_RANK_RE.search(head)) is not None):
        out["node_rank"] = int(m.group(1))
    if (any(x in head for x in (b"nproc", b"local_worker_num", b"local_world_size=")) and
            (m := NPROC_RE.search(head)) is not None):
        out["nproc_per_node"] = int(m.group(1))
    return out


def comm_inits(buf: bytes) -> list[tuple[str, int, int]]:
    """(group, rank in the group, group size) of every HCCL communicator set-up line in ``buf``."""
    return [(m.group("group").decode("utf-8", "replace"), int(m.group("rank")), int(m.group("size")))
            for rx in COMM_INIT_RES for m in rx.finditer(buf)]
# "[rank3]:" at the start of a line, after a pasted line number ("[80746] ") or a launcher's tag
RANK_PREFIX_RE = re.compile(rb"^(?:\[\d+\] |\S+ \[std(?:err|out)\] |\(\w+ pid=\d+\) )?\[rank(\d{1,9})(?!\d)\]:", re.M)


# the fields of torch elastic's failure summary under "Root Cause (first observed failure):" (torch.distributed.elastic
# multiprocessing errors: time, host, rank, exitcode with its pid, error_file, traceback)
ROOT_HOST_RE = re.compile(rb"^\s{0,8}host\s{0,8}: ([\w.-]{1,253})\s*$", re.M)
ROOT_EXIT_RE = re.compile(rb"^\s{0,8}exitcode\s{0,8}: (-?\d{1,4}) \(pid: (\d{1,10})\)", re.M)
ROOT_SIGNAL_RE = re.compile(rb"Signal (\d{1,2}) \((SIG[A-Z]{2,6})\) received by PID")


def root_cause(following: bytes) -> dict:
    """torchrun's 'Root Cause (first observed failure)' block, a few lines below: its rank, and where they say
    so its host, exit code, pid and signal (``rank`` missing when the block names none)."""
    block = following[:1024]
    m = TORCHRUN_ROOT_RE.search(block)
    if m is None:
        return {}
    out: dict = {"rank": int(m.group(1))}
    if (h := ROOT_HOST_RE.search(block)) is not None:
        out["host"] = h.group(1).decode()
    if (x := ROOT_EXIT_RE.search(block)) is not None:
        out["exitcode"], out["pid"] = int(x.group(1)), int(x.group(2))
    if (g := ROOT_SIGNAL_RE.search(block)) is not None:
        out["signal"] = f"{g.group(2).decode()} ({g.group(1).decode()})"
    return out


def field_rule(line: bytes) -> FieldRule | None:
    for rule in FIELD_RULES:
        if rule.pattern.search(line):
            return rule
    return None


def _text(raw: bytes, limit: int = 120) -> str:
    """A captured field as text: any bytes, decoded with replacement, control characters shown as '?', bounded."""
    return bytes(b if 32 <= b != 127 else 63 for b in raw[:limit]).decode("utf-8", "replace")


def line_facts(line: bytes) -> dict:
    """What one line says about the ranks involved (only the keys it gives)."""
    out: dict = {}
    for rx in REPORTER_RES:
        m = rx.search(line)
        if m:
            out["reporter"] = int(m.group(1))
            break
    m = LOCAL_RANK_RE.search(line)
    if m:
        out["local_rank"] = int(m.group(1))
    m = SEQ_RE.search(line)
    if m:
        out["seq"], out["op"] = int(m.group(1)), m.group(2).decode()
    m = REMOTE_RE.search(line)
    if m:
        # HCCL prints an unknown remote as "unknown" or as (u32)-1 = 4294967295 (with "remote rank:[local]")
        out["remote_rank"] = None if m.group(1).lower() == b"unknown" or m.group(1) == UNKNOWN_RANK else int(m.group(1))
    m = GROUP_RE.search(line)
    if m:
        out["group"] = _text(m.group(1))
    m = RANK_SIZE_RE.search(line)
    if m:
        out["rank_size"] = int(m.group(1))
    m = LOCATION_RE.search(line)
    if m:
        # an address or type of any bytes (a damaged or hostile log): decoded with replacement, shown on one line
        out["located_rank"], out["located_ip"] = int(m.group(2)), _text(m.group(1))
        out["exception_type"] = _text(m.group(5))
        if m.group(4):
            out["reporter"] = int(m.group(4))
    if b"crimer" in line and (m := CRIMER_RE.search(line)):
        out["located_ip"] = _text(m.group(1))
        if m.group(3):
            out["informer"] = int(m.group(3))
    if (link := link_facts(line)) is not None:
        out["link"] = link
    for rx in PEER_RES:
        m = rx.search(line)
        if m:
            out["peer"] = m.group(1).decode("utf-8", "replace")
            if m.lastindex and m.lastindex >= 2:
                out["peer_port"] = int(m.group(2))
            break
    return out


def prefixed_ranks(head: bytes) -> set[int]:
    """Ranks named by ``[rankN]:`` line prefixes (torchrun's --tee / log_line_prefix). The multi-line
    regex tries every line start; the literal test skips it where no prefix can be (most files)."""
    if b"[rank" not in head:
        return set()
    return {int(x) for x in RANK_PREFIX_RE.findall(head)}


def split_by_rank_prefix(data: bytes) -> dict[int | None, bytes]:
    """One file's lines grouped by their ``[rankN]:`` prefix; unprefixed lines stay with the rank of
    the line before them (a traceback's continuation), those before any prefix under None."""
    parts: dict[int | None, list[bytes]] = {}
    current: int | None = None
    for line in data.splitlines(keepends=True):
        m = RANK_PREFIX_RE.match(line)
        if m:
            current = int(m.group(1))
            line = line[m.end():]
        parts.setdefault(current, []).append(line)
    return {k: b"".join(v) for k, v in parts.items()}
