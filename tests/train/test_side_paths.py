"""Where a run writes besides its records (logs/, checkpoints/, tensorboard/, hf/, manifest.json,
metrics.jsonl, plan.json): a file, a directory or a link in the way, a read-only or a full disk is one line
before a step runs; TensorBoard events that stop mid-run (a disk that fills) are one warning line at the
end of a run that finished, never a traceback or a hang."""

from __future__ import annotations

import io
import multiprocessing
import os
import resource
import signal

import pytest

from porting.rundir import RunDirError, check_side_paths
from porting.train.recipe.schema import LoggingSection
from porting.train.run.watch import Watch, read_scalars

DIRS = ("logs", "checkpoints", "tensorboard", "hf")


@pytest.mark.parametrize("name,kind", [(d, k) for d in DIRS for k in ("file", "link")]
                         + [(f, k) for f in ("manifest.json", "metrics.jsonl", "plan.json") for k in ("dir", "link")])
def test_a_side_path_in_the_way_is_one_line(tmp_path, name, kind):
    run = tmp_path / "run"
    run.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    p = run / name
    {"file": lambda: p.write_text("x"), "dir": p.mkdir, "link": lambda: p.symlink_to(elsewhere)}[kind]()
    with pytest.raises(RunDirError, match=rf"{p}: exists and is not a (directory|regular file) .*remove it") as e:
        check_side_paths(run, DIRS)
    assert "\n" not in str(e.value) and list(elsewhere.iterdir()) == [], "nothing written through the link"


def test_an_hf_directory_port_did_not_write_is_refused_before_training(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "mine.txt").write_text("keep me")
    with pytest.raises(RunDirError, match="holds files port did not write"):
        check_side_paths(tmp_path, DIRS)
    check_side_paths(tmp_path, ("logs", "checkpoints"))   # no export: the folder is nobody's business
    (tmp_path / "hf" / "port_manifest.json").write_text("{}")
    check_side_paths(tmp_path, DIRS)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["hf", "mine.txt", "port_manifest.json"], "probes removed"


def _as_nobody(run: str, q) -> None:
    try:
        os.setgid(65534)
        os.setuid(65534)   # root writes anywhere; an unprivileged user meets the read-only directory
        check_side_paths(__import__("pathlib").Path(run), DIRS)
        q.put("accepted")
    except RunDirError as e:
        q.put(str(e))
    except BaseException as e:   # noqa: BLE001  reported to the test, not lost in the child
        q.put(repr(e))


@pytest.mark.skipif(os.getuid() != 0, reason="changes to an unprivileged user (needs root); as a user, chmod does it")
def test_a_read_only_run_directory_is_refused_before_training():
    import shutil
    import tempfile
    from pathlib import Path

    base = Path(tempfile.mkdtemp(prefix="port-ro-"))   # /tmp: every user may pass through
    try:
        run = base / "run"
        (run / "tensorboard").mkdir(parents=True)
        os.chmod(base, 0o755)
        os.chmod(run, 0o777)
        os.chmod(run / "tensorboard", 0o555)   # the run directory writable, its tensorboard/ not
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=_as_nobody, args=(str(run), q))
        p.start()
        p.join(60)
        msg = q.get(timeout=5)
        assert msg.startswith(f"{run / 'tensorboard'}: cannot write there (Permission denied)"), msg
    finally:
        shutil.rmtree(base)


def _fill_the_disk_mid_run(run: str, q) -> None:
    """In a child: the file-size limit (EFBIG, as a full disk) reached after a few steps of events."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    out = io.StringIO()
    w = Watch(LoggingSection(tensorboard=True, progress="lines"), __import__("pathlib").Path(run), 200, stream=out)
    for n in range(1, 201):
        w.step({"step": n, "loss": 2.0 / n, "lr": 1e-3, "grad_norm": 1.0})
    w.close()
    q.put(out.getvalue())


def test_events_that_stop_mid_run_are_one_warning_at_the_end(tmp_path):
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_fill_the_disk_mid_run, args=(str(tmp_path), q))
    p.start()
    p.join(60)
    assert p.exitcode == 0, "the run did not finish"
    text = q.get(timeout=5)
    lines = text.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: logging.tensorboard: the event file stopped at step ")
    assert "File too large" in lines[0] and "Traceback" not in text
    kept = [s for s, _ in read_scalars(tmp_path)["train/loss"]]
    assert kept and kept == list(range(1, len(kept) + 1)) and len(kept) < 200   # the steps before the failure
