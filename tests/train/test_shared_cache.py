"""A compile cache shared by runs (PORT_COMPILE_CACHE_SHARED, porting/train/run/shared_cache.py): published
atomically per rank, copied into a run's own folder before it compiles, never read without READY, bounded."""

from __future__ import annotations

import os

from porting.train.run import shared_cache as sc
from porting.train.run.precompile import cache_key


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


def test_published_once_then_adopted_by_another_run(tmp_path):
    shared, a, b = tmp_path / "shared" / "key-entry", tmp_path / "a" / "cc", tmp_path / "b" / "cc"
    _graphs(a, 0, b"first")
    assert sc.publish(shared, a, 0) and (shared / "rank_0" / sc.READY).is_file()
    _graphs(b, 0, b"second")
    assert not sc.publish(shared, b, 0)   # the first publisher's folder stays
    assert (shared / "rank_0" / "graph_cache" / "MS_WORKERcompile_cache_0.mindir").read_bytes() == b"first"
    c = tmp_path / "c" / "cc"
    assert sc.adopt(shared, c, 0) and not sc.adopt(shared, c, 0)   # once; a run's own folder is never replaced
    assert (c / "rank_0" / "graph_cache" / "MS_WORKERcompile_cache_0.mindir").read_bytes() == b"first"
    assert not (c / "rank_0" / sc.READY).exists() and not sc.adopt(shared, c, 1)   # rank 1 was never published
    assert [p.name for p in shared.iterdir()] == ["rank_0"] and sorted(p.name for p in c.iterdir()) == ["rank_0"]


def test_a_folder_without_ready_a_link_or_too_large_is_not_adopted(tmp_path, monkeypatch):
    shared, own = tmp_path / "shared", tmp_path / "own"
    _graphs(shared, 0)                          # a publisher that died before READY
    assert not sc.adopt(shared, own, 0) and not (own / "rank_0").exists()
    (shared / "rank_0" / sc.READY).write_text("")
    os.symlink("/etc/passwd", shared / "rank_0" / "graph_cache" / "link")
    assert not sc.adopt(shared, own, 0) and not (own / "rank_0").exists()
    (shared / "rank_0" / "graph_cache" / "link").unlink()
    monkeypatch.setattr(sc, "MAX_BYTES", 3)
    assert not sc.adopt(shared, own, 0) and not sc.publish(tmp_path / "s2", shared, 0)
    monkeypatch.setattr(sc, "MAX_BYTES", 1 << 20)
    assert sc.adopt(shared, own, 0) and not list(own.glob(".rank_*"))   # no temporary copy left behind
