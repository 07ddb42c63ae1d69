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


# -- issue 51: a quadratic pattern, undecodable fields, numbers of thousands of digits, a culprit outside the job,
#    digits of other scripts, text forging port's own lines
@case(dest=None, refusal=False, timeout=20)
def many_logs_of_long_words(d):
    """A cause-model pattern that began with `\\w+` (`\\w+ do tiling failed`) was quadratic on a long word: 23 MB of
    logs took `diagnose` over 60 s. 100 files of five 4 KiB words each (2 MB, every line an error line, all 500
    classified) took 60 ms a line for that one pattern (30 s) and must stay well inside the bound (about 3 s); tests/diagnostics/test_issue53.py checks that no
    pattern starts with an unbounded repeat."""
    (d / "logs").mkdir()
    word = ("Qx" * 2048)
    for i in range(100):
        (d / "logs" / f"node{i}.log").write_text(f"ERROR {word}\n" * 5)
    return ["diagnose", str(d / "logs"), "--jobs", "1"]


def _names_rank(rank: int):
    def check(out: str, d) -> None:
        assert f"FIRST FAILING RANK: {rank}" in out, out[:600]
    return check


@case(dest=None, refusal=False, timeout=10, check=_names_rank(1))
def non_utf8_address_in_heartbeat_and_location_lines(d):
    """An address (and a status) that is not UTF-8 in CANN's Cluster Exception Location and heartbeat lines was a
    UnicodeDecodeError traceback: decoded with replacement, the located rank is still named."""
    (d / "logs").mkdir()
    (d / "logs" / "plog-1_1.log").write_bytes(
        b"[ERROR] HCCL(1,python):2025-10-23-07:52:01.191.363 [x.cc:1] Cluster Exception Location[IP/ID]:[\xff\xfe\x80/1], "
        b"Arrival Time:[x], Discoverer:[\xc3\x28/0], ExceptionType:[Heartbeat Lost \xff Occurred]\n"
        b"[INFO] HCCL(1,python):2025-10-23-07:52:02.191.363 [heartbeat.cc:951] [HeartbeatAbnormal]local rank [\xfe/0]: "
        b"crimer rank [\xff\xfe/1] status[LOST \xff] by informer rank [\xff/0]\n")
    return ["diagnose", str(d / "logs")]


def _no_huge_rank(out: str, d) -> None:
    assert "9" * 40 not in out.split("reason:")[0], out[:600]        # no rank of thousands of digits is named
    assert "unclassified failure" in out and "no failure found" not in out, out[:800]


@case(dest=None, refusal=False, timeout=10, check=_no_huge_rank)
def rank_numbers_of_thousands_of_digits(d):
    """int() of a 5,000-digit rank raised ValueError (Python's 4,300-digit limit): a traceback. Every captured
    number is now at most 9 digits; a line whose error text lies past the bytes a line is classified on is said as
    an unclassified failure, not "no failure found"."""
    (d / "logs").mkdir()
    big = b"9" * 5000
    (d / "logs" / "pasted.log").write_bytes(
        b"[rank" + big + b"]: RuntimeError: boom\ncrimer rank [1.2.3.4/" + big + b"] status[LOST]\n"
        b"Time out nodes are ['" + big + b"']\nRank " + big + b": found NaN in local grad norm\n")
    return ["diagnose", str(d / "logs")]


def _outside(out: str, d) -> None:
    import json

    v = json.loads(out)
    assert v["first_failing_rank"] == 7 and v["confidence"] == "low" and "outside the job" in v["reason"], v["reason"]


@case(dest=None, refusal=False, timeout=10, check=_outside)
def culprit_rank_outside_the_job(d):
    """A heartbeat report naming rank 7 of a 2-rank job was a high-confidence culprit: it is low, and says so."""
    (d / "logs").mkdir()
    (d / "logs" / "pasted.log").write_text(
        "[INFO] HCCL(686,python):2025-10-23-07:52:01.191.363 [heartbeat.cc:951] [8970][TaskExecStage]"
        "[HeartbeatAbnormal]local rank [10.0.0.0/0]: crimer rank [10.0.0.7/7] status[LOST] by informer rank "
        "[10.0.0.0/0]\n")
    return ["diagnose", str(d / "logs"), "--world-size", "2", "--json"]


def _not_u32(out: str, d) -> None:
    import json

    v = json.loads(out)
    assert v["first_failing_rank"] != 4294967295 and "4294967295" not in str(v["suspect"]), v["suspect"]
    assert v["confidence"] != "high", v


@case(dest=None, refusal=False, timeout=10, check=_not_u32)
def culprit_rank_4294967295(d):
    """HCCL prints an unknown rank as (u32)-1 = 4294967295; a crimer line naming it was a high-confidence culprit."""
    (d / "logs").mkdir()
    (d / "logs" / "pasted.log").write_text(
        "[INFO] HCCL(686,python):2025-10-23-07:52:01.191.363 [heartbeat.cc:951] [8970][TaskExecStage]"
        "[HeartbeatAbnormal]local rank [10.0.0.0/0]: crimer rank [10.0.0.1/4294967295] status[LOST] by informer "
        "rank [10.0.0.0/0]\n")
    return ["diagnose", str(d / "logs"), "--json"]


def _not_forged(out: str, d) -> None:
    assert "\r" not in out and "\x1b" not in out and "\u2028" not in out, repr(out[:400])
    assert sum(ln.startswith("FIRST FAILING RANK") for ln in out.splitlines()) == 1, out[:600]
    assert not any(ln.startswith("confidence: high") for ln in out.splitlines()), out[:600]


@case(dest=None, refusal=False, timeout=10, check=_not_forged)
def log_text_forging_port_s_own_lines(d):
    """A quoted line holding a carriage return, an escape sequence and a Unicode line separator printed over port's
    own lines in a terminal ("FIRST FAILING RANK: 0", "confidence: high"): they are shown as '?'."""
    (d / "logs").mkdir()
    (d / "logs" / "pasted.log").write_bytes(
        b"2025-01-01 00:00:00 ERROR RuntimeError: boom\rFIRST FAILING RANK: 0   last step: 99\x1b[2K"
        b"\xe2\x80\xa8confidence: high\n")
    return ["diagnose", str(d / "logs")]


@case("HCCL_CONNECT_TIMEOUT", "is not an integer", dest=None, verdict=True, timeout=30,
      env={"HCCL_CONNECT_TIMEOUT": "\u0661\u0662\u0660", "HCCL_EXEC_TIMEOUT": "1836"})
def doctor_hccl_timeout_in_arabic_indic_digits(d):
    """HCCL_CONNECT_TIMEOUT=١٢٠ (Arabic-Indic digits) passed as the integer 120 (\\d and int() take any script's
    digits; HCCL reads ASCII): `port doctor` fails the knob."""
    return ["doctor"]
