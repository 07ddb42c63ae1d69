"""The shared compile cache (``PORT_COMPILE_CACHE_SHARED``, porting/train/run/step/shared_cache.py) fed hostile folders:
a run adopts a folder only when its manifest names this run's key, model and configuration and the folder holds
exactly the regular files it lists, with their digests; nothing under ``DIR`` is read or written through a link;
nothing outside the run's own cache folder changes (every file under the case hashed before and after,
tests/attacks/harness.py ``snapshot``). The end-to-end runs (a link at ``DIR/<key>-<entry>`` while training, the
losses of a run that refused it equal to those of a fresh compile) are tests/train/test_shared_cache.py's slow test,
which these runs were folded into."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from porting.train.run.step import shared_cache as sc
from tests.attacks.harness import changes, snapshot

RECIPE, MODEL, SHAPES = {"seed": 0, "optimizer": {"grad_clip": 1.0}}, {"hidden_size": 64, "num_hidden_layers": 1}, [(4, 64)]
MINE = sc.Identity.of("a" * 16, RECIPE, MODEL, SHAPES, 1)


def _published(root: Path, ident: sc.Identity = MINE, data: bytes = b"graph") -> Path:
    """A folder published the one way port publishes (a rank's graph_cache, its manifest), at root/<key>-entry."""
    own = root.parent / f"{root.name}-own"
    (own / "rank_0" / "graph_cache").mkdir(parents=True)
    (own / "rank_0" / "graph_cache" / "compile_cache_0.mindir").write_bytes(data)
    (own / "rank_0" / "graph_cache" / "compile_dependency.hash").write_text("deps")
    shared = root / "key-entry"
    assert sc.publish(shared, own, 0, ident)[0]
    return shared


def _refused(tmp_path: Path, shared: Path, *words: str) -> None:
    own = tmp_path / "run" / "compile_cache" / "k"
    own.parent.mkdir(parents=True, exist_ok=True)   # the run's directory is there before its precompile
    before = snapshot(tmp_path, own)
    adopted, note = sc.adopt(shared, own, 0, MINE)
    assert not adopted and "not adopted" in note and "compiling" in note and "\n" not in note, note
    for w in words:
        assert w in note, note
    assert not (own / "rank_0").exists() and not list(own.glob(".rank_*"))
    assert changes(before, snapshot(tmp_path, own)) == []


@pytest.mark.parametrize("other, word", [
    (sc.Identity.of("a" * 16, {**RECIPE, "optimizer": {"grad_clip": 0.5}}, MODEL, SHAPES, 1), "another configuration"),
    (sc.Identity.of("a" * 16, RECIPE, {**MODEL, "num_hidden_layers": 5}, SHAPES, 1), "another model"),
    (sc.Identity.of("b" * 16, RECIPE, MODEL, SHAPES, 1), "another key")])
def test_a_folder_compiled_for_another_configuration_model_or_key_is_not_adopted(tmp_path, other, word):
    """A graph planted from another configuration trained to that configuration's losses; one from another model
    made every step NaN: the folder's manifest names what it was compiled for."""
    _refused(tmp_path, _published(tmp_path / "shared", other), word)


def _edit(shared: Path, fn) -> None:
    ready = shared / "rank_0" / sc.READY
    doc = json.loads(ready.read_text())
    fn(doc)
    ready.write_text(json.dumps(doc))


def test_a_forged_manifest_over_other_bytes_is_not_adopted(tmp_path):
    shared = _published(tmp_path / "shared")
    (shared / "rank_0" / "graph_cache" / "compile_cache_0.mindir").write_bytes(b"another model's graph")
    _refused(tmp_path, shared, "compile_cache_0.mindir", "sha256")


@pytest.mark.parametrize("plant, words", [
    (lambda s: (s / "rank_0" / "graph_cache" / "extra.mindir").write_bytes(b"x"), ("does not list", "extra.mindir")),
    (lambda s: (s / "rank_0" / "graph_cache" / "compile_dependency.hash").unlink(), ("lacks 1",)),
    (lambda s: os.mkfifo(s / "rank_0" / "graph_cache" / "pipe"), ("pipe", "not a regular file")),
    (lambda s: os.symlink("/etc/passwd", s / "rank_0" / "graph_cache" / "link"), ("link",)),
    (lambda s: _edit(s, lambda d: d.update(files={})), ("lists no files",)),
    (lambda s: _edit(s, lambda d: d.pop("format")), ("not a port-compile-cache/1 manifest",)),
    (lambda s: (s / "rank_0" / sc.READY).write_text(""), ("not a port manifest",)),
    (lambda s: ((s / "rank_0" / sc.READY).unlink(), os.mkfifo(s / "rank_0" / sc.READY)), ("READY is not a regular file",)),
    (lambda s: (s / "rank_0" / sc.READY).write_bytes(b"{" * (2 << 20)), ("larger than 1 MiB",)),
], ids=["extra_file", "missing_file", "fifo", "link_inside", "no_files", "no_format", "empty_ready", "fifo_ready",
        "ready_2_mib"])
def test_a_folder_holding_anything_but_its_own_regular_files_is_not_adopted(tmp_path, plant, words):
    """Nothing but the regular files its manifest lists, with their sizes and digests; a FIFO never blocks."""
    shared = _published(tmp_path / "shared")
    plant(shared)
    _refused(tmp_path, shared, *words)


def test_a_link_at_the_keys_folder_is_neither_followed_nor_written_through(tmp_path):
    """``DIR/<key>-<entry>`` planted as a link: the run published its graphs (they hold the weights) into the
    link's target, outside DIR, and adopted what the target held."""
    target = _published(tmp_path / "elsewhere")            # a real published folder of this very identity
    empty = tmp_path / "empty_target"
    empty.mkdir()
    root = tmp_path / "shared"
    root.mkdir()
    os.symlink(target, root / "key-entry")
    _refused(tmp_path, root / "key-entry", "link")
    own = tmp_path / "run" / "compile_cache" / "k"
    (own / "rank_0" / "graph_cache").mkdir(parents=True)
    (own / "rank_0" / "graph_cache" / "compile_cache_0.mindir").write_bytes(b"weights")
    os.unlink(root / "key-entry")
    os.symlink(empty, root / "key-entry")
    before = snapshot(tmp_path, None)
    published, note = sc.publish(root / "key-entry", own, 0, MINE)
    assert not published and "not published" in note and "link" in note, note
    assert changes(before, snapshot(tmp_path, None)) == [] and list(empty.iterdir()) == []


def test_a_link_at_the_ranks_folder_is_neither_followed_nor_written_through(tmp_path):
    target = _published(tmp_path / "elsewhere")
    root = tmp_path / "shared" / "key-entry"
    root.mkdir(parents=True)
    os.symlink(target / "rank_0", root / "rank_0")
    _refused(tmp_path, root, "link")
    own = tmp_path / "run" / "compile_cache" / "k"
    (own / "rank_0").mkdir(parents=True)
    (own / "rank_0" / "g").write_bytes(b"weights")
    before = snapshot(tmp_path, None)
    assert not sc.publish(root, own, 0, MINE)[0]
    assert changes(before, snapshot(tmp_path, None)) == []
