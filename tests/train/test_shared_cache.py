"""A compile cache shared by runs (PORT_COMPILE_CACHE_SHARED, porting/train/run/step/shared_cache.py): published
atomically per rank, copied into a run's own folder before it compiles, never read without READY, bounded."""

from __future__ import annotations

import json
import os

import pytest

from porting.train.run.step import shared_cache as sc
from porting.train.run.step.precompile import cache_key


def _graphs(own, rank, data=b"graph"):
    d = own / f"rank_{rank}" / "graph_cache"
    d.mkdir(parents=True)
    (d / "MS_WORKERcompile_cache_0.mindir").write_bytes(data)
    return d


def test_off_unless_set_and_keyed_without_the_masters_address(tmp_path):
    assert sc.folder("k", {}) is None and sc.folder("k", {sc.ENV: " "}) is None
    assert sc.folder("k", {sc.ENV: str(tmp_path)}).parent == tmp_path
    doc = {"cluster": {"master_port": 8118, "master_addr": "127.0.0.1", "devices_per_node": 2},
           "optimizer": {"grad_clip": 1.0}}
    other = {"cluster": {"master_port": 9000, "master_addr": "10.0.0.1", "devices_per_node": 2},
             "optimizer": {"grad_clip": 1.0}}
    key = cache_key(sc.graph_doc(doc), {"hidden_size": 64}, [(1, 80)], 2)
    assert key == cache_key(sc.graph_doc(other), {"hidden_size": 64}, [(1, 80)], 2)
    assert doc["cluster"]["master_port"] == 8118   # the recipe's own document is left as it was
    changed = {"cluster": dict(doc["cluster"], devices_per_node=4), "optimizer": {"grad_clip": 1.0}}
    assert cache_key(sc.graph_doc(changed), {"hidden_size": 64}, [(1, 80)], 2) != key
    clip = {"cluster": doc["cluster"], "optimizer": {"grad_clip": 0.5}}
    assert cache_key(sc.graph_doc(clip), {"hidden_size": 64}, [(1, 80)], 2) != key


ID = sc.Identity.of("k" * 16, {"seed": 0}, {"hidden_size": 64}, [(1, 80)], 1)


def test_published_once_then_adopted_by_another_run(tmp_path):
    shared, a, b = tmp_path / "shared" / "key-entry", tmp_path / "a" / "cc", tmp_path / "b" / "cc"
    _graphs(a, 0, b"first")
    assert sc.publish(shared, a, 0, ID)[0] and (shared / "rank_0" / sc.READY).is_file()
    _graphs(b, 0, b"second")
    assert sc.publish(shared, b, 0, ID) == (False, "")   # the first publisher's folder stays
    assert (shared / "rank_0" / "graph_cache" / "MS_WORKERcompile_cache_0.mindir").read_bytes() == b"first"
    c = tmp_path / "c" / "cc"
    adopted, note = sc.adopt(shared, c, 0, ID)
    assert adopted and "copied from" in note and sc.adopt(shared, c, 0, ID) == (False, "")   # once; never replaced
    assert (c / "rank_0" / "graph_cache" / "MS_WORKERcompile_cache_0.mindir").read_bytes() == b"first"
    assert not (c / "rank_0" / sc.READY).exists() and sc.adopt(shared, c, 1, ID) == (False, "")   # rank 1: none
    assert [p.name for p in shared.iterdir()] == ["rank_0"] and sorted(p.name for p in c.iterdir()) == ["rank_0"]


def test_a_folder_without_ready_a_link_or_too_large_is_not_adopted(tmp_path, monkeypatch):
    own, src = tmp_path / "own", tmp_path / "src"
    _graphs(src, 0)
    shared = tmp_path / "shared" / "key-entry"
    assert sc.publish(shared, src, 0, ID)[0]
    (shared / "rank_0" / sc.READY).rename(tmp_path / "ready")   # a publisher that died before READY
    assert sc.adopt(shared, own, 0, ID) == (False, "") and not (own / "rank_0").exists()
    (tmp_path / "ready").rename(shared / "rank_0" / sc.READY)
    os.symlink("/etc/passwd", shared / "rank_0" / "graph_cache" / "link")
    adopted, note = sc.adopt(shared, own, 0, ID)
    assert not adopted and "graph_cache/link is a link" in note and not (own / "rank_0").exists()
    (shared / "rank_0" / "graph_cache" / "link").unlink()
    monkeypatch.setattr(sc, "MAX_BYTES", 3)
    assert "more than" in sc.adopt(shared, own, 0, ID)[1] and not sc.publish(tmp_path / "s2" / "k", src, 0, ID)[0]
    monkeypatch.setattr(sc, "MAX_BYTES", 1 << 20)
    assert sc.adopt(shared, own, 0, ID)[0] and not list(own.glob(".rank_*"))   # no temporary copy left behind


def test_keyed_without_the_values_that_never_reach_a_graph():
    doc = {"model": {"source": "/a/model"}, "output_dir": "/runs/a", "schedule": {"max_steps": 3},
           "checkpointing": {"every_steps": 0}, "logging": {"every_steps": 1}, "seed": 0,
           "cluster": {"master_port": 8118, "devices_per_node": 2}, "optimizer": {"grad_clip": 1.0}}
    other = {"model": {"source": "/b/model"}, "output_dir": "/runs/b", "schedule": {"max_steps": 9},
             "checkpointing": {"every_steps": 2}, "logging": {"every_steps": 5}, "seed": 0,
             "cluster": {"master_port": 9000, "devices_per_node": 2}, "optimizer": {"grad_clip": 1.0}}
    key = cache_key(sc.graph_doc(doc), {"hidden_size": 64}, [(1, 80)], 2)
    assert key == cache_key(sc.graph_doc(other), {"hidden_size": 64}, [(1, 80)], 2)
    assert doc["schedule"] == {"max_steps": 3} and doc["model"]["source"] == "/a/model"   # left as it was
    for section, value in (("seed", 1), ("optimizer", {"grad_clip": 0.5})):
        assert cache_key(sc.graph_doc(dict(doc, **{section: value})), {"hidden_size": 64}, [(1, 80)], 2) != key


@pytest.mark.slow
def test_a_graph_cached_with_other_weights_and_schedule_trains_as_a_fresh_compile(tmp_path, model_dir):
    """The key leaves out the model's directory and the schedule (NOT_GRAPH): a run of other weights and
    another learning-rate schedule that adopts the first run's graphs gives the losses of its own fresh
    compile, bit for bit. One layer of stories260K (tests/conftest.py model_dir)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from tests.attacks.harness import changes, snapshot
    from tests.helpers import port_process
    from tests.train.conftest import TINY, metrics

    other = tmp_path / "other"
    other.mkdir()
    for f in model_dir.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    rng = np.random.default_rng(1)
    w = load_file(str(model_dir / "model.safetensors"))
    save_file({k: v + np.float32(0.01) * rng.standard_normal(v.shape, np.float32) for k, v in w.items()},
              str(other / "model.safetensors"))
    shared = tmp_path / "shared"
    # two bucket shapes and 2 accumulation steps: the accumulation graph is the one a cache once broke
    # (tests/train/test_precompile.py test_compile_cache_is_written_under_the_run_and_reused_with_the_same_losses)
    common = ["batching.micro_batch_size=2", "batching.grad_accum_steps=2", "checkpointing.export_hf=false"]

    def run(name, source, steps, cache):
        sets = [a for s in common + [f"model.source={source}", f"schedule.max_steps={steps}"] for a in ("--set", s)]
        port_process("train", str(TINY), "--run-dir", str(tmp_path / name), *sets, check=True, timeout=900,
                     env={sc.ENV: str(cache) if cache else ""})
        return [s["loss"] for s in metrics(tmp_path / name)[0]], (tmp_path / name / "logs" / "rank_0.log").read_text()

    _, log_a = run("a", model_dir, 2, shared)
    adopted, log_b = run("b", other, 3, shared)
    # the fresh reference runs with DIR/<key>-<entry> planted as a link to the published folder itself (issue 51:
    # the link was followed, its graphs adopted, and a run publishing there wrote through it): it must refuse the
    # link, compile fresh and leave the link's target as it was
    (name,) = [p.name for p in shared.iterdir()]
    # the real published folder, offered to a run of another model (every step NaN when adopted, issue 51): refused
    mine = json.loads((shared / name / "rank_0" / sc.READY).read_text())
    other_model = sc.Identity(mine["key"], "0" * 64, mine["configuration"])
    assert "another model" in sc.adopt(shared / name, tmp_path / "probe", 0, other_model)[1]
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(shared / name, linked / name)
    before = snapshot(shared, None)
    fresh, log_c = run("c", other, 3, linked)
    assert "published to" in log_a and "copied from" in log_b and "copied from" not in log_c
    assert "not adopted: " in log_c and "is a link or not a folder: not followed" in log_c, log_c[-2000:]
    assert "not published to" in log_c and changes(before, snapshot(shared, None)) == []
    assert "graphs for shapes [[2, 96], [2, 128]]" in log_b
    assert len(adopted) == 3 and adopted == fresh, (adopted, fresh)


def test_keyed_on_the_kernel_libraries_a_graph_loads(monkeypatch):
    from model_zoo import cpu_kernels

    monkeypatch.setattr(cpu_kernels, "_HANDED_OUT", {"/home/a/.cache/port/kernels/port_cpu_kernels-avx2-1.so"})
    key = cache_key({"seed": 0}, {"hidden_size": 64}, [(1, 80)], 1)
    monkeypatch.setattr(cpu_kernels, "_HANDED_OUT", {"/home/b/.cache/port/kernels/port_cpu_kernels-avx2-1.so"})
    assert cache_key({"seed": 0}, {"hidden_size": 64}, [(1, 80)], 1) != key


@pytest.mark.slow
def test_a_graph_that_loads_a_removed_kernel_library_is_not_adopted(tmp_path, model_dir):
    """A run's graphs hold the path of port's C++ kernel library (ops.Custom aot). A run whose kernels were built
    in another folder, since removed, publishes; a run with the same recipe and its own kernel folder compiles
    fresh and trains (a graph adopted across the two failed at step 1: "couldn't find the AOT binary file")."""
    import shutil

    from tests.helpers import port_process
    from tests.train.conftest import TINY, metrics, small_settings

    shared, kernels = tmp_path / "shared", tmp_path / "kernels"

    def run(name, kernel_cache):
        sets = [a for s in small_settings(model_dir, "schedule.max_steps=2", "checkpointing.export_hf=false")
                for a in ("--set", s)]
        p = port_process("train", str(TINY), "--run-dir", str(tmp_path / name), *sets, timeout=900,
                         env={sc.ENV: str(shared), "PORT_KERNEL_CACHE": str(kernel_cache)})
        assert p.returncode == 0, p.stderr[-3000:]
        return [s["loss"] for s in metrics(tmp_path / name)[0]], (tmp_path / name / "logs" / "rank_0.log").read_text()

    first, log_a = run("a", kernels / "a")
    assert "published to" in log_a and list((kernels / "a").glob("port_cpu_kernels-*.so"))   # its graphs load it
    shutil.rmtree(kernels / "a")
    second, log_b = run("b", kernels / "b")
    assert "copied from" not in log_b and "published to" in log_b
    assert second == first
