"""The job document: what a run is, resolved once, written once per revision, read by every rank.

A :class:`Job` is the recipe with every ``--set`` applied and its paths made absolute (``Recipe``), the plan made
from it (``TrainPlan``), the run directory, why this revision exists and how it differs from the one before
(:class:`Start`), where it came from (:class:`Source`: the user's file, its digest, the overrides as typed, the
command) and the environment report the launcher took once (`port doctor`'s, handed down from the CLI). It is
written atomically to ``RUN/job.json`` (revision 1) and ``RUN/job.<n>.json`` beside it for every later revision,
never over one: a shrink, a non-finite rollback that skips data, a resume with an edited recipe each write the next
revision. Every rank starts from ``--run-dir RUN [--revision N]`` and reads the job with :meth:`Job.read` (one
bounded reader); no rank reads the user's YAML or a ``--set`` string, so a recipe file edited during a run changes
nothing until the user starts a new run or resumes with it, and then the difference is printed and recorded
(:meth:`Job.resumed`). As torchtitan builds one typed config and hands it down, and Megatron-Bridge writes its
config container beside the checkpoint and reads it back instead of re-parsing the user's file.

Several nodes: each node's launcher makes the same recipe and plan from the same command (no timestamps, nothing of
the node in them); a revision already on disk is kept when its recipe and plan are the same (a shared filesystem),
and a different one is refused in one line. The command and the environment report are the first writer's (node
0's, which starts first).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from model_zoo.config import LlamaConfig
from model_zoo.errors import RecipeError
from model_zoo.files import read_json_object, write_atomic
from porting.model_paths import resolve_hf
from porting.rundir.paths import RunDir
from porting.train.plan.make import TrainPlan, plan_run
from porting.train.recipe.schema import Recipe, load_recipe, recipe_dict, validate_recipe

FORMAT = "port-job"
VERSION = 1
MAX_JOB_BYTES = 8 << 20          # a 13B plan with every proposal is ~60 KB
MAX_JOB_DEPTH = 16               # recipe and plan nest 4-5 levels
MAX_REVISIONS = 10_000           # a supervised run makes at most one per incident
_REVISION_FILE = re.compile(r"job\.(\d{1,5})\.json")


class JobError(RecipeError):
    """A job document that cannot be read, written or continued (exit code of a recipe error)."""


@dataclass(frozen=True)
class Source:
    """Where the job came from, as the user typed it (a record: nothing is read from here again)."""

    recipe_path: str
    recipe_sha256: str
    overrides: tuple[str, ...]
    command: tuple[str, ...]


@dataclass(frozen=True)
class Start:
    """Why this revision exists and what differs from the revision before it (``changes``: "key: old -> new")."""

    reason: str
    changes: tuple[str, ...] = ()
    devices: tuple[int, ...] | None = None   # this node's devices after a shrink (None: the recipe's own)


@dataclass(frozen=True)
class Job:
    recipe: Recipe
    plan: TrainPlan
    run: RunDir
    start: Start
    source: Source
    environment: Mapping[str, Any] | None = None   # `port doctor`'s report, taken once by the launcher
    revision: int = 1

    # ------------------------------------------------------------------ making one
    @classmethod
    def from_command(cls, recipe_path: str, overrides: list[str], run_dir: Path, command: list[str]) -> Job:
        """The job of ``port train RECIPE --set ...``: the recipe read and resolved once, its plan, revision 1."""
        rec = load_recipe(recipe_path, overrides)
        return cls.of(rec, run_dir, Source(str(recipe_path), file_sha256(Path(recipe_path)), tuple(overrides),
                                           tuple(command)))

    @classmethod
    def of(cls, recipe: Recipe, run_dir: str | Path, source: Source | None = None) -> Job:
        """A job for an already validated recipe (revision 1): the library's way in, for a caller that holds a
        ``Recipe`` (a benchmark, a test) rather than a command."""
        plan, _ = plan_run(recipe, str(run_dir), resume=False, dry_run=False)
        return cls(recipe, plan, RunDir(run_dir), Start("port train"), source or Source("", "", (), ()))

    def plan_model_config(self) -> dict[str, Any]:
        """The HF config of the model the plan was made from (read again from its config.json)."""
        return model_config(self.recipe).to_hf()

    def with_environment(self, report: Mapping[str, Any] | None) -> Job:
        return dataclasses.replace(self, environment=report)

    def revise(self, values: Mapping[str, Any], reason: str, devices: tuple[int, ...] | None = None) -> Job:
        """The next revision: ``values`` (``{"section.key": value}``) set on this job's recipe, planned again."""
        rec = self.recipe.with_overrides(values)
        plan, _ = plan_run(rec, str(self.run.path), resume=False, dry_run=False)
        return dataclasses.replace(self, recipe=rec, plan=plan, revision=self.revision + 1,
                                   start=Start(reason, tuple(recipe_changes(self.recipe, rec)),
                                               devices if devices is not None else self.start.devices))

    def resumed(self, previous: Job) -> Job:
        """This job (made from the user's command) continuing ``previous``, the run's newest revision: the same
        revision when the recipes are equal, else the next one with the differences recorded."""
        changes = tuple(recipe_changes(previous.recipe, self.recipe))
        if not changes and previous.plan.to_dict() != self.plan.to_dict():
            changes = ("plan: differs with the same recipe (the model's config.json, or port's planner, changed)",)
        if not changes:
            return dataclasses.replace(self, revision=previous.revision, start=previous.start)
        return dataclasses.replace(self, revision=previous.revision + 1,
                                   start=Start(f"resumed with {self.source.recipe_path or 'a recipe'}", changes))

    # ------------------------------------------------------------------ the document
    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "revision": self.revision,
                "start": dataclasses.asdict(self.start), "source": dataclasses.asdict(self.source),
                "recipe": recipe_dict(self.recipe), "plan": self.plan.to_dict(),
                "environment": dict(self.environment) if self.environment is not None else None}

    def write(self) -> Path:
        """Write this revision atomically; a revision already on disk is never replaced: the same document is
        kept (another node wrote it), a different one refused."""
        path = job_path(self.run, self.revision)
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise JobError(f"{path}: is not a file port wrote (a link or a folder); remove it or choose another "
                           "--run-dir")
        if path.exists():
            old = Job.read(self.run, self.revision)
            if _shared(old.to_dict()) != _shared(self.to_dict()):
                raise JobError(f"{path}: revision {self.revision} of this run's job already exists and says something "
                               "else (another launch with another recipe?); use another --run-dir, or --resume to "
                               "continue the run")
            return path
        self.run.path.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n", error=JobError)
        return path

    @classmethod
    def read(cls, run: RunDir | str | Path, revision: int | None = None) -> Job:
        """Revision ``revision`` of the run's job (None: the newest), checked and bounded."""
        run = run if isinstance(run, RunDir) else RunDir(run)
        n = revision if revision is not None else newest_revision(run)
        if n is None:
            raise JobError(f"{run.path}: has no {job_path(run, 1).name}; start the run with `port train RECIPE "
                           f"--run-dir {run.path}`, which writes it")
        path = job_path(run, n)
        if path.is_symlink():
            raise JobError(f"{path}: is a link; port reads only the job document it wrote there")
        doc = read_json_object(path, what="job document", max_bytes=MAX_JOB_BYTES, max_depth=MAX_JOB_DEPTH,
                               error=JobError)
        return _from_dict(doc, run, n, path)


def _from_dict(doc: dict[str, Any], run: RunDir, n: int, path: Path) -> Job:
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise JobError(f"{path}: key 'format'/'version' is {doc.get('format')!r}/{doc.get('version')!r}, expected "
                       f"{FORMAT!r}/{VERSION}; it was not written by this port")
    if doc.get("revision") != n:
        raise JobError(f"{path}: key 'revision' is {doc.get('revision')!r}, the file name says {n}: renamed or "
                       "copied from another revision")
    for key in ("start", "source", "recipe", "plan"):
        if not isinstance(doc.get(key), dict):
            raise JobError(f"{path}: key '{key}' is missing or not an object; the job document is damaged")
    env = doc.get("environment")
    if env is not None and not isinstance(env, dict):
        raise JobError(f"{path}: key 'environment' is {type(env).__name__}, expected an object or null")
    rec = validate_recipe(doc["recipe"], f"{path}: recipe", run.path)
    try:
        start = Start(str(doc["start"]["reason"]), tuple(str(c) for c in doc["start"].get("changes") or ()),
                      _devices(doc["start"].get("devices")))
        src = doc["source"]
        source = Source(str(src["recipe_path"]), str(src["recipe_sha256"]), tuple(str(o) for o in src["overrides"]),
                        tuple(str(c) for c in src["command"]))
        plan = TrainPlan.from_dict(doc["plan"], f"{path}: plan")
    except (KeyError, TypeError, ValueError) as e:
        raise JobError(f"{path}: {type(e).__name__} reading 'start', 'source' or 'plan' ({str(e)[:120]}); the job "
                       "document is damaged") from None
    return Job(rec, plan, run, start, source, env, n)


def _devices(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 4096
                                              for d in value):
        raise ValueError("start.devices: expected a list of device ids")
    return tuple(value)


def _shared(doc: dict[str, Any]) -> dict[str, Any]:
    """What every node's launcher of one run must agree on: the recipe and the plan (the command line differs by
    its --launch-node, the environment report by the node)."""
    return {k: doc.get(k) for k in ("format", "version", "revision", "recipe", "plan")}


def job_path(run: RunDir, revision: int) -> Path:
    """``RUN/job.json`` for revision 1, ``RUN/job.<n>.json`` for revision n."""
    if not 1 <= revision <= MAX_REVISIONS:
        raise JobError(f"--revision {revision}: expected 1..{MAX_REVISIONS}")
    return run.path / ("job.json" if revision == 1 else f"job.{revision}.json")


def newest_revision(run: RunDir) -> int | None:
    """The highest revision on disk (None: no job document)."""
    if not run.path.is_dir():
        return None
    found = [int(m.group(1)) for p in run.path.iterdir() if (m := _REVISION_FILE.fullmatch(p.name))]
    found = [n for n in found if 2 <= n <= MAX_REVISIONS]
    if found:
        return max(found)
    return 1 if job_path(run, 1).exists() else None


def model_config(recipe: Recipe) -> LlamaConfig:
    """The architecture of the recipe's checkpoint (its config.json: a real run plans from it)."""
    return LlamaConfig.from_hf(resolve_hf(recipe.model.source))


def file_sha256(path: Path) -> str:
    """The recipe file's digest as read (the file is bounded by the recipe reader before this)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def recipe_changes(old: Recipe, new: Recipe) -> list[str]:
    """Every leaf that differs, as "section.key: old -> new" (sorted by key)."""
    out: list[str] = []
    _diff(recipe_dict(old), recipe_dict(new), "", out)
    return sorted(out)


def _diff(a: Any, b: Any, where: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            _diff(a.get(k), b.get(k), f"{where}.{k}" if where else str(k), out)
    elif a != b:
        out.append(f"{where}: {json.dumps(a)} -> {json.dumps(b)}")
