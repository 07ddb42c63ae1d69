"""`port rehearse`: an output folder that exists (a user's files) is never written into; a bad rung list or a
recipe that does not parse is refused before anything is written."""

from __future__ import annotations

from tests.attacks.harness import case
from tests.conftest import ROOT

TINY = str(ROOT / "recipes" / "tiny-cpu.yaml")


@case("exists and is not empty")
def out_folder_that_holds_a_users_files(d):
    (d / "out").mkdir()
    (d / "out" / "notes.txt").write_text("a user's file\n")
    return ["rehearse", TINY, "--out", "out"]


@case("unknown rung(s) ['everything']")
def unknown_rung(d):
    return ["rehearse", TINY, "--out", "out/r", "--rungs", "single,everything"]


@case("recipe.yaml", "batching.micro_batch_sise")
def recipe_with_a_typo(d):
    (d / "recipe.yaml").write_text((ROOT / "recipes" / "tiny-cpu.yaml").read_text().replace(
        "micro_batch_size", "micro_batch_sise"))
    return ["rehearse", "recipe.yaml", "--out", "out/r"]


@case("cannot create the rehearsal folder")
def out_under_a_regular_file(d):
    (d / "out").mkdir()
    (d / "out" / "file").write_text("a file\n")
    return ["rehearse", TINY, "--out", "out/file/r"]
