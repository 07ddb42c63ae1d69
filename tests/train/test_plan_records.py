"""The typed plan (porting/train/plan/make.py ``TrainPlan``): every part a frozen record made where it is computed,
``plan.json`` its ``to_dict``, and ``TrainPlan.from_dict`` (model_zoo/typed.py, strict) reading it back as the same
object; a document that is not a plan is refused in one line naming the key. Dry-run plans: no MindSpore."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from model_zoo.errors import ConfigError
from porting.rundir import RunRecords
from porting.train import load_recipe, plan_run
from porting.train.plan.make import TrainPlan
from tests.train.conftest import ROOT, tiny_plan

RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def _records(obj: object, where: str = "plan") -> list[str]:
    """Where a part of the plan is still a dict (a name -> value map of a record's field is fine: launch.env)."""
    out = []
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        for x in (v if isinstance(v, tuple) else (v,)):
            if dataclasses.is_dataclass(x):
                out += _records(x, f"{where}.{f.name}")
            elif isinstance(x, dict) and f.name not in ("env", "measured_shape"):
                out.append(f"{where}.{f.name}")
    return out


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_recipes_plan_reads_back_as_the_same_record(path):
    rec = load_recipe(str(path), [], check_files=False)
    plan, _ = plan_run(rec, "runs/x", False, True)   # the dry run's plan: no checkpoint needed here
    text = json.dumps(plan.to_dict(), indent=2)                      # plan.json, as porting/launch/start.py writes it
    back = TrainPlan.from_dict(json.loads(text), "plan.json")
    assert back == plan and json.dumps(back.to_dict(), indent=2) == text
    assert not _records(back), _records(back)
    assert (back.launch is None) == (rec.world_size == 1) and (back.links is None) == (rec.cluster.device != "ascend")


def test_a_multi_device_cpu_plan_reads_back_with_its_launch_and_no_estimate():
    plan = tiny_plan("cluster.devices_per_node=2", "parallel.optimizer_sharding=true", "batching.grad_accum_steps=2")
    doc = json.loads(json.dumps(plan.to_dict()))
    assert doc["estimated_step"] == doc["throughput"] == doc["links"] == {} and doc["padding"] is None
    back = TrainPlan.from_dict(doc)
    assert back == plan and back.launch is not None and back.estimated_step is None and back.sharding.enabled
    assert back.launch.env == plan.launch.env and int(back.launch.env["HCCL_EXEC_TIMEOUT"]) >= 1836


@pytest.fixture(scope="module")
def ascend() -> TrainPlan:
    """A plan with every part: launch, roofline estimate, proposals, links (recipes/7b-8card.yaml)."""
    rec = load_recipe(str(ROOT / "recipes" / "7b-8card.yaml"), [], check_files=False)
    return plan_run(rec, "runs/x", False, True)[0]


def _bad(plan: TrainPlan, mutate) -> str:
    doc = json.loads(json.dumps(plan.to_dict()))
    mutate(doc)
    with pytest.raises(ConfigError) as e:
        TrainPlan.from_dict(doc, "RUN/plan.json")
    msg = str(e.value)
    assert msg.startswith("RUN/plan.json: ") and "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("mutate, says", [
    (lambda d: d.pop("allowances"), "missing key 'allowances'"),
    (lambda d: d.update(allowances={}), "missing allowances.line_s"),
    (lambda d: d["launch"].update(retries=3), "unknown key launch.retries (a LaunchPlan has no such key)"),
    (lambda d: d.update(kernels={"attention": "flash"}), "unknown key kernels (a TrainPlan"),
    (lambda d: d["launch"]["env"].update(HCCL_EXEC_TIMEOUT=5), "launch.env.HCCL_EXEC_TIMEOUT is '5', expected a string"),
    (lambda d: d.update(world_size=True), "world_size is 'True', expected a whole number"),
    (lambda d: d["memory_gib_by_phase"].update(total="big"), "memory_gib_by_phase.total is 'big', expected a number"),
    (lambda d: d["precision"].update(param_dtype="float8"), "precision: param_dtype: "),
    (lambda d: d["estimated_step"].update(kind="guess"), "estimated_step.kind is 'guess', expected 'roofline' or null"),
    (lambda d: d["proposals"][1]["estimate"].pop("step_s"), "missing proposals[1].estimate.step_s"),
    (lambda d: d.update(estimated_step=3), "estimated_step is '3', expected RooflineStep or CalibratedStep or null"),
    (lambda d: d["collectives"][0].update(count=[1]), "collectives[0].count is '[1]', expected a whole number"),
    (lambda d: d.update(warnings="one"), "warnings is 'one', expected a list"),
])
def test_a_document_that_is_not_a_plan_is_one_line_naming_the_key(ascend, mutate, says):
    assert says in _bad(ascend, mutate)


def test_every_problem_is_named_at_once_and_a_list_is_refused_whole(ascend):
    msg = _bad(ascend, lambda d: (d.pop("fits"), d.update(nodes="2")))
    assert "missing key 'fits'" in msg and "nodes is '2'" in msg
    with pytest.raises(ConfigError, match=r"^plan: top level is list, expected an object"):
        TrainPlan.from_dict([ascend.to_dict()])


def test_the_report_takes_a_refused_plan_json_as_a_note(ascend, tmp_path):
    from porting.report.rows import read_plan

    good = RunRecords(tmp_path, None, [], plan=ascend.to_dict())
    assert read_plan(good) == ascend and not good.notes
    doc = copy.deepcopy(ascend.to_dict())
    doc["memory_gib_by_phase"] = {"total": 4.0}
    bad = RunRecords(tmp_path, None, [], plan=doc)
    assert read_plan(bad) is None and bad.notes[0].startswith("plan.json: not a plan this port writes: missing "
                                                              "memory_gib_by_phase.weights")


def test_a_record_that_holds_the_plan_reads_it_through_from_dict(ascend):
    """A document that holds a plan (the job's, porting/job/) reads it with the same reader: the plan's own
    from_dict, its problems collected with the holder's."""
    from model_zoo import typed

    @dataclasses.dataclass(frozen=True)
    class Holder:
        revision: int
        plan: TrainPlan

    doc = {"revision": 1, "plan": json.loads(json.dumps(ascend.to_dict()))}
    assert typed.build(Holder, doc, strict=True) == Holder(1, ascend) and typed.write(Holder(1, ascend)) == doc
    doc["plan"]["launch"]["env"]["HCCL_EXEC_TIMEOUT"] = 5
    out: list[str] = []
    typed.problems(Holder, doc, "", out, strict=True)
    assert len(out) == 1 and out[0].startswith("plan: plan: not a plan this port writes: launch.env.HCCL_EXEC_TIMEOUT")
