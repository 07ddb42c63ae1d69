"""Watching runs: TensorBoard event files written by a real `port train` and read back, W&B offline,
a progress bar with ETA on a terminal and plain lines when not."""

from __future__ import annotations

import io
import sys

import pytest

from model_zoo.errors import RecipeError
from porting.train.recipe.schema import LoggingSection
from porting.train.run.watch import read_scalars, Watch
from tests.train.conftest import FAST, TINY, error_line, metrics
from tests.helpers import port


@pytest.fixture(scope="module")
def tb_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("tb") / "run"
    port("train", str(TINY), *FAST, "--set", "schedule.max_steps=4", "--set", "logging.tensorboard=true",
         "--run-dir", str(run), check=True)
    return run


@pytest.mark.slow
def test_tensorboard_events_hold_every_step(tb_run):
    steps, _ = metrics(tb_run)
    sc = read_scalars(tb_run)
    for key, tag in (("loss", "train/loss"), ("lr", "train/lr"), ("grad_norm", "train/grad_norm"),
                     ("tokens_per_s", "train/tokens_per_s"), ("padding_fraction", "train/padding_fraction"),
                     ("host_rss_gib", "memory/host_rss_gib")):
        got = sc[tag]
        assert [s for s, _ in got] == [1, 2, 3, 4], tag
        for (_, v), rec in zip(got, steps):
            assert v == pytest.approx(rec[key], rel=1e-6, abs=1e-6), (tag, v, rec[key])
    # a damaged file is refused, not misread
    f = next((tb_run / "tensorboard").glob("events.out.tfevents.*"))
    raw = bytearray(f.read_bytes())
    raw[-5] ^= 0xFF
    f.write_bytes(bytes(raw))
    with pytest.raises(RecipeError, match="damaged TensorBoard record"):
        read_scalars(tb_run)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal_plain_lines_otherwise(tmp_path):
    term = _Terminal()
    w = Watch(LoggingSection(), tmp_path, total_steps=3, stream=term)
    for n in (1, 2, 3):
        w.step({"step": n, "loss": 2.0 / n, "tokens_per_s": 100.0})
    w.close()
    out = term.getvalue()
    assert "3/3" in out and "<" in out and "loss=0.6667" in out, out   # tqdm's [elapsed<remaining]
    plain = io.StringIO()
    w = Watch(LoggingSection(), tmp_path, total_steps=3, stream=plain)
    assert w.bar is None
    w.step({"step": 1, "loss": 1.0})
    w.close()
    assert plain.getvalue() == ""
    assert Watch(LoggingSection(progress="lines"), tmp_path, 3, stream=_Terminal()).bar is None


def test_wandb_without_the_package_is_one_line(tmp_path, monkeypatch):
    # the test extra installs wandb: a None entry in sys.modules makes `import wandb` raise ImportError, as it does
    # where the package is absent (`port` runs in this process, tests/helpers.py)
    monkeypatch.setitem(sys.modules, "wandb", None)
    r = port("train", str(TINY), *FAST, "--set", "logging.wandb=true", "--run-dir", str(tmp_path / "run"))
    assert r.returncode == 2 and "logging.wandb: the wandb package is not installed" in error_line(r)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_wandb_offline_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    w = Watch(LoggingSection(wandb=True, progress="lines"), tmp_path, 2)
    w.step({"step": 1, "loss": 1.5, "lr": 1e-3})
    w.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs and any(p.suffix == ".wandb" for p in runs[0].iterdir())
