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


# -- issue 40
@case("recipe.yaml", "seed: line", "an integer of 5,000 digits")
def recipe_with_a_5000_digit_integer(d):
    (d / "recipe.yaml").write_text((ROOT / "recipes" / "tiny-cpu.yaml").read_text().replace(
        "seed: 0", "seed: " + "9" * 5000))
    return ["rehearse", "recipe.yaml", "--out", "out/r"]


@case("--rung-set 'x'", "aliases")
def rung_set_alias_bomb(d):
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    return ["rehearse", TINY, "--out", "out/r", "--rungs", "single", "--rung-set", "x=" + "\n".join(lines)]


@case("is a symbolic link", dest=None)
def out_is_a_link_to_an_empty_folder(d):
    import os

    (d / "elsewhere").mkdir()
    os.symlink(d / "elsewhere", d / "out")
    return ["rehearse", TINY, "--out", "out"]


def _rehearsed(line: str, d) -> None:
    assert (d / "out" / "rehearse.json").is_file(), "the rehearsal was not written into the empty folder"


@case(refusal=False, check=_rehearsed, timeout=60)
def out_is_an_existing_empty_folder(d):
    """An empty folder (made by the user for it) was refused as 'already exists'; the rule takes it."""
    (d / "out").mkdir()
    return ["rehearse", TINY, "--out", "out", "--rungs", "two-nodes"]
