"""Resume, launch arguments and the processes port starts: `port train --resume` on a forged,
renamed, out-of-range or foreign per-rank checkpoint (porting/train/run/checkpoint/resume_check.py), node ranks
the recipe does not have, a master address no node can reach, and malformed node fingerprints in
`port doctor --cluster`. Each is one error line before anything waits or a worker starts; the checkpoint
a resume refuses is left as it was."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.attacks import inputs as I
from tests.attacks.harness import case

RANK0 = "rank_00000.safetensors"


def _sums(ck: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(ck.iterdir())}


def _untouched(line: str, d: Path) -> None:
    """The refused checkpoint is exactly as it was, and no worker started (no msrun log directory)."""
    sums = json.loads((d / "sums.json").read_text())
    for name, want in sums.items():
        assert _sums(d / "out" / "checkpoints" / name) == want, f"{name} changed"
    assert not (d / "out" / "logs" / "msrun").exists(), "msrun was started"


def _resume(d: Path, damage, edit=None, resume: bool = True, step_dir: str = "step_2") -> list[str]:
    ck = I.train_checkpoint(d / "out" / "checkpoints" / "step_2")
    damage(ck)
    root = d / "out" / "checkpoints"
    (d / "sums.json").write_text(json.dumps({p.name: _sums(p) for p in root.iterdir()}))
    return ["train", str(I.recipe(d, edit)), *(["--resume"] if resume else [])]


def _state(**changes):
    def damage(ck: Path) -> None:
        I.update_json(ck / "state.json", **changes)
    return damage


def _resume_case(name: str, damage, *expect: str, edit=None, resume: bool = True) -> None:
    def gen(d: Path) -> list[str]:
        return _resume(d, damage, edit, resume)
    gen.__name__ = name
    globals()[name] = case(*expect, timeout=120, check=_untouched)(gen)


def _rename_to(n: int, **state):
    def damage(ck: Path) -> None:
        if state:
            _state(**state)(ck)
        ck.rename(ck.parent / f"step_{n}")
    return damage


def _truncate(ck: Path) -> None:
    p = ck / RANK0
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _two_devices(r: dict) -> None:   # the same global batch on 2 workers: a layout change made exact
    r["cluster"]["devices_per_node"] = 2
    r["batching"]["micro_batch_size"] = 2


# -- the run's state forged: it must agree with the layout record rank 0 wrote
_resume_case("resume_forged_world_size", _state(world_size=2), "state.json",
             "key 'world_size' is 2, the layout record says 1")
_resume_case("resume_forged_seed", _state(seed=9), "state.json", "key 'seed' is 9, the layout record says 0")
_resume_case("resume_forged_shards", _state(shards=3), "state.json", "shards 3 > world_size 1")
# -- every state.json field range-checked
_resume_case("resume_next_step_1e12", _state(next_step=10 ** 12), "key 'next_step'", "[0, 1000000000]")
_resume_case("resume_adam_t_beyond_next_step", _state(adam_t=9), "adam_t 9 > next_step 2")
_resume_case("resume_loss_scale_1e308", _state(loss_scale={"scale": 1e308, "good": 0}), "key 'loss_scale.scale'")
_resume_case("resume_loss_scale_good_negative", _state(loss_scale={"scale": 1.0, "good": -1}),
             "key 'loss_scale.good'")
_resume_case("resume_seed_is_a_bool", _state(seed=True), "key 'seed' is bool")
_resume_case("resume_world_size_2_pow_20", _state(world_size=1 << 20), "key 'world_size'", "[1, 65536]")
_resume_case("resume_next_step_beyond_max_steps", _rename_to(50, step=50, next_step=50, adam_t=50),
             "next_step 50 is beyond schedule.max_steps 2", "raise schedule.max_steps")
# -- a step directory from elsewhere: renamed, or another run's
_resume_case("resume_renamed_step_dir", _rename_to(7), "step_7", "renamed, or taken from another run")
_resume_case("resume_step_dir_of_another_recipe", lambda ck: None, "cannot continue exactly: recipe.optimizer.lr",
             edit=I.set_key("optimizer.lr", 0.5))
_resume_case("resume_on_two_devices_with_another_global_batch", lambda ck: None,
             "cannot continue exactly: global_batch (checkpoint 4, this run 8)",
             edit=I.set_key("cluster.devices_per_node", 2))
# -- damaged files: the reason on the terminal, before msrun (a 2-worker resume of the same global batch)
_resume_case("resume_truncated_rank_file_on_two_workers", _truncate, RANK0, "truncated or replaced", edit=_two_devices)
_resume_case("resume_rank_file_missing_on_two_workers", lambda ck: (ck / RANK0).unlink(), RANK0, "missing",
             edit=_two_devices)
_resume_case("resume_state_missing", lambda ck: (ck / "state.json").unlink(), "has no state.json")
# -- a damaged state: the same advice with and without --resume
_resume_case("damaged_state_with_resume", lambda ck: (ck / "state.json").write_text("{bad"), "state.json",
             "the checkpoint is damaged: delete", "rerun with --resume to continue from the checkpoint before it")
_resume_case("damaged_state_without_resume", lambda ck: (ck / "state.json").write_text("{bad"), "state.json",
             "the checkpoint is damaged: delete", "rerun with --resume to continue from the checkpoint before it",
             resume=False)


# -- launch arguments: refused before the preflight waits for node 0 (the old code waited 125 s)
@case("--launch-node 5", "node ranks 0..1", timeout=20)
def launch_node_5_on_a_2_node_recipe(d):
    return ["train", str(I.recipe(d, I.set_key("cluster.nodes", 2))), "--launch-node", "5"]


@case("--launch-node 3", "node ranks 0..0", timeout=20)
def launch_node_3_on_a_1_node_recipe(d):
    return ["train", str(I.recipe(d)), "--launch-node", "3"]


@case("--launch-node -1", timeout=20)
def launch_node_negative(d):
    return ["train", str(I.recipe(d, I.set_key("cluster.nodes", 2))), "--launch-node", "-1"]


@case("--node-rank 4", "node ranks 0..1", timeout=20, dest=None)
def doctor_node_rank_beyond_the_nodes(d):
    return ["doctor", "--cluster", str(I.recipe(d, I.set_key("cluster.nodes", 2))), "--node-rank", "4", "--no-smoke"]


def _master_case(name: str, addr: str, *expect: str, command: str = "train") -> None:
    def gen(d: Path) -> list[str]:
        r = str(I.recipe(d, I.set_key("cluster.master_addr", addr)))
        return ["train", r, "--launch-node", "0"] if command == "train" else ["doctor", "--cluster", r, "--no-smoke"]
    gen.__name__ = name
    globals()[name] = case("cluster.master_addr", *expect, timeout=20, dest=None if command == "doctor" else "out")(gen)


_master_case("master_addr_empty", "", "is empty")
_master_case("master_addr_blank", "   ", "is empty")
_master_case("master_addr_shell_text", "node0; rm -rf /", "neither an IP address nor a host name")
_master_case("master_addr_unspecified", "0.0.0.0", "unspecified")
_master_case("master_addr_300_chars", "a" * 300, "neither an IP address nor a host name")
_master_case("master_addr_bad_octet", "10.0.0.300", "neither an IP address nor a host name")
_master_case("doctor_cluster_master_addr_empty", "", "is empty", command="doctor")


# -- node fingerprints in `port doctor --cluster`: one line naming the file and the key, never a traceback
def _fingerprint_case(name: str, body: str, *expect: str) -> None:
    def gen(d: Path) -> list[str]:
        fp = d / "fp"
        fp.mkdir()
        (fp / "node_1.json").write_text(body)
        return ["doctor", "--cluster", str(I.recipe(d, I.set_key("cluster.nodes", 2))), "--fingerprint-dir", str(fp),
                "--no-smoke"]
    gen.__name__ = name
    globals()[name] = case("node_1.json", *expect, timeout=30, dest="fp")(gen)


_fingerprint_case("fingerprint_knobs_a_list", '{"knobs": [1, 2], "versions": {}}', "key 'knobs' is list")
_fingerprint_case("fingerprint_versions_nested", '{"knobs": {}, "versions": {"cann": {"x": 1}}}',
                  "key 'versions' is an object with non-string values")
_fingerprint_case("fingerprint_not_json", "{node 1", "node fingerprint")
_fingerprint_case("fingerprint_a_list", "[1, 2]", "expected a JSON object")
_fingerprint_case("fingerprint_nested_100000", I.deep_json(), "node fingerprint")


# -- where a supervised run writes (RUN/incidents.jsonl, RUN/incidents/, RUN/supervise/): a link planted there
# is refused before anything starts, and nothing outside the run is written through it
def _planted_case(name: str, planted: str, target_is_dir: bool, *expect: str) -> None:
    def gen(d: Path) -> list[str]:
        outside = d / ("outside_dir" if target_is_dir else "outside.jsonl")
        if target_is_dir:
            outside.mkdir()
            (outside / "keep.txt").write_text("the user's\n")
        else:
            outside.write_text('{"the user\'s": 1}\n')
        (d / "out").mkdir()
        (d / "out" / planted).symlink_to(outside)
        return ["train", str(I.recipe(d, I.set_key("cluster.devices_per_node", 2))), "--supervise", "--no-preflight"]
    gen.__name__ = name
    globals()[name] = case(planted, *expect, timeout=60)(gen)


_planted_case("supervise_incidents_jsonl_is_a_link_outside", "incidents.jsonl", False, "not a regular file")
_planted_case("supervise_incidents_dir_is_a_link_outside", "incidents", True, "not a directory")
_planted_case("supervise_supervise_dir_is_a_link_outside", "supervise", True, "not a directory")
