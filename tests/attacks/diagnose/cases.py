"""`port diagnose LOGDIR`: never blocks, never quadratic, never a traceback. The scanner fixes (FIFO,
long lines, UTF-16) belong to the diagnostics work; these cases state the expected behaviour."""

from __future__ import annotations

import os

from tests.attacks import inputs as I
from tests.attacks.harness import case


@case("not a regular file (FIFO), skipped", dest=None, subprocess=True, timeout=10)
def only_a_fifo_named_log(d):
    """A FIFO named worker_0.log blocked diagnose forever: it must be skipped (with a note)."""
    (d / "logs").mkdir()
    os.mkfifo(d / "logs" / "worker_0.log")
    return ["diagnose", str(d / "logs")]


@case(dest=None, refusal=False, subprocess=True, timeout=10)
def a_fifo_beside_a_real_log(d):
    (d / "logs").mkdir()
    os.mkfifo(d / "logs" / "worker_1.log")
    (d / "logs" / "worker_0.log").write_text("step 1 loss 2.0\nERROR EI9999 something failed\n")
    return ["diagnose", str(d / "logs")]


@case(dest=None, refusal=False, timeout=10)
def one_8_mb_line_of_error_words(d):
    """1/2/4/8 MB took 0.97/3.3/12.8/46 s (quadratic): 8 MB must finish well inside the bound."""
    (d / "logs").mkdir()
    (d / "logs" / "worker_0.log").write_text("ERROR timeout HCCL EI0006 failed " * 250_000 + "\n")
    return ["diagnose", str(d / "logs")]


@case(dest=None, refusal=False, timeout=10)
def utf16_log_is_read(d):
    (d / "logs").mkdir()
    (d / "logs" / "worker_0.log").write_bytes("step 3 loss 1.0\nERROR EI0006 timeout\n".encode("utf-16"))
    return ["diagnose", str(d / "logs")]


@case(dest=None, refusal=False, timeout=10)
def symlink_loop_in_logdir(d):
    (d / "logs").mkdir()
    os.symlink(d / "logs", d / "logs" / "loop")
    (d / "logs" / "worker_0.log").write_text("step 1 loss 2.0\n")
    return ["diagnose", str(d / "logs")]


@case(dest=None, refusal=False, timeout=10)
def binary_log(d):
    (d / "logs").mkdir()
    (d / "logs" / "worker_0.log").write_bytes(os.urandom(1 << 16))
    return ["diagnose", str(d / "logs")]


@case("no log files found", dest=None)
def empty_logdir(d):
    (d / "logs").mkdir()
    return ["diagnose", str(d / "logs")]


@case(dest=None)
def logdir_missing(d):
    return ["diagnose", str(d / "nope")]


@case(dest=None)
def out_under_proc(d):
    (d / "logs").mkdir()
    (d / "logs" / "worker_0.log").write_text("step 1 loss 2.0\n")
    return ["diagnose", str(d / "logs"), "--out", "/proc/port-attack/diag.json"]


@case(dest=None)
def out_under_a_file(d):
    (d / "logs").mkdir()
    (d / "logs" / "worker_0.log").write_text("step 1 loss 2.0\n")
    (d / "f").write_text("x")
    return ["diagnose", str(d / "logs"), "--out", str(d / "f" / "diag.json")]


@case(dest=None, refusal=False, timeout=10)
def cann_blocks_of_endless_continuation_lines(d):
    """Issue 28 reads each error line's block (indented CANN continuation lines) for its class and entities:
    500 headlines each followed by 200 indented lines full of device/rank/PID tokens (8.5 MB) must stay bounded
    (MAX_BLOCK_LINES, MAX_BLOCK_BYTES, MAX_ENTITIES in porting/diagnostics/causes.py)."""
    (d / "logs").mkdir()
    cont = "        device_id=1 chipId:2 dieId:0 PID:3 rank:4 dst_rank[5] Device[6] lost heartbeat\n" * 200
    (d / "logs" / "pasted.log").write_text(("EZ9999: Inner Error!\n" + cont) * 500)
    return ["diagnose", str(d / "logs")]


@case(dest=None, refusal=False, timeout=10)
def one_8_mb_line_of_entity_tokens(d):
    """One 8 MB line of fault texts and entity tokens: classified on its first MAX_LINE bytes only."""
    (d / "logs").mkdir()
    (d / "logs" / "pasted.log").write_text("Device[1] lost heartbeat chipId:1 dst_rank[0] NPU 3; " * 160_000 + "\n")
    return ["diagnose", str(d / "logs")]


# -- --out under the converters' rule
@case("worker_0.log", "overlaps the input", dest=None)
def out_is_a_log_being_diagnosed(d):
    (d / "logs").mkdir()
    (d / "logs" / "worker_0.log").write_text("step 1 loss 2.0\n")
    return ["diagnose", str(d / "logs"), "--out", str(d / "logs" / "worker_0.log")]


@case("mine.json", "exists and is not a diagnosis port wrote", dest=None)
def out_over_a_users_file(d):
    (d / "logs").mkdir()
    (d / "logs" / "worker_0.log").write_text("step 1 loss 2.0\n")
    I.canary(d, "mine.json")
    return ["diagnose", str(d / "logs"), "--out", str(d / "mine.json")]
