"""The test material port ships (tests/fixtures): the copies are the real files (their recorded digests, and
../shared's files where it is beside the clone), every shipped file has its source and licence in the README,
every written rank table stands for a real template and copies none, and the embedded model is shared's."""

from __future__ import annotations

import hashlib
import json

from tests.conftest import EMBEDDED, FIXTURES, ROOT, SHARED, SHIPPED_ASCEND, WRITTEN_FOR, WRITTEN_TABLES


def _sums(path=SHIPPED_ASCEND / "SHA256SUMS") -> dict[str, str]:
    lines = path.read_text().splitlines()
    return {rel: digest for digest, rel in (line.split("  ", 1) for line in lines)}


def test_shipped_copies_are_the_recorded_real_files():
    sums = _sums()
    shipped = {p.relative_to(SHIPPED_ASCEND).as_posix() for p in SHIPPED_ASCEND.rglob("*") if p.is_file()}
    assert shipped - {"README.md", "SHA256SUMS"} - {f for f in shipped if f.startswith("LICENSES/")} == set(sums)
    for rel, digest in sums.items():
        assert hashlib.sha256((SHIPPED_ASCEND / rel).read_bytes()).hexdigest() == digest, rel
        real = SHARED / "data" / "ascend" / rel
        if SHARED.is_dir():  # where ../shared is beside the clone, the copy is its file, byte for byte
            assert hashlib.sha256(real.read_bytes()).hexdigest() == digest, rel


def test_every_shipped_file_has_its_source_and_licence():
    readme = (SHIPPED_ASCEND / "README.md").read_text()
    for rel in _sums():
        folder, name = rel.rsplit("/", 1)
        # a row names the file, or its folder with a pattern (`logs/<folder>/...`)
        assert f"`{rel}`" in readme or f"`{folder}/" in readme, rel
    for licence in ("LICENSES/mindspore-docs.Apache-2.0.txt", "LICENSES/mindspore-docs.NOTICE",
                    "LICENSES/mind-cluster.Apache-2.0.txt"):
        assert (SHIPPED_ASCEND / licence).stat().st_size > 0 and f"`{licence}`" in readme
    assert "Apache License" in (SHIPPED_ASCEND / "LICENSES/mind-cluster.Apache-2.0.txt").read_text()


def test_written_tables_are_each_an_equivalent_and_none_is_a_copy():
    written = {p.name for p in WRITTEN_TABLES.iterdir()}
    assert written == set(WRITTEN_FOR.values())
    readme = (WRITTEN_TABLES.parent / "README.md").read_text()
    assert all(f"`rank_tables/{n}`" in readme for n in written)
    if SHARED.is_dir():  # written from the format, not copied: no written table equals a real one
        real = {json.dumps(json.loads(p.read_text()), sort_keys=True)
                for p in (SHARED / "data/ascend/rank_tables").iterdir()}
        assert not real & {json.dumps(json.loads((WRITTEN_TABLES / n).read_text()), sort_keys=True) for n in written}


def test_embedded_model_and_text_are_the_shared_ones():
    """What port ships (model_zoo/assets/stories260k, porting/train/assets) is the real model and text that
    shared/README describes and its golden facts belong to: digests recorded from ../shared, which a plain
    clone checks against, and ../shared itself where it is beside the clone."""
    shipped = {f"data/models/stories260k/{p.name}": p for p in EMBEDDED.iterdir() if p.name != "LICENSE"}
    shipped["data/text/tinystories_sample.txt"] = ROOT / "porting" / "train" / "assets" / "tinystories_sample.txt"
    sums = _sums(FIXTURES / "shared_model.SHA256SUMS")
    assert set(shipped) == set(sums)
    for rel, path in shipped.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sums[rel], rel
        if SHARED.is_dir():
            assert hashlib.sha256((SHARED / rel).read_bytes()).hexdigest() == sums[rel], rel
    assert "MIT" in (EMBEDDED / "LICENSE").read_text()
