"""The zoo users extend: `port zoo add/remove/list`, every `--hf NAME` resolving user names, the new
built-in presets against their published sizes, and `model_zoo` as a library exactly as docs/data.md
shows it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from model_zoo import presets
from model_zoo.errors import ConfigError, UnknownModelError
from tests.helpers import port

ROOT = Path(__file__).resolve().parents[2]
STORIES = ROOT / "model_zoo" / "assets" / "stories260k"


@pytest.mark.parametrize("name,params", [
    ("llama3.2-1b", 1_235_814_400), ("llama3.2-3b", 3_212_749_824), ("qwen2.5-7b", 7_615_616_512),
    ("qwen2.5-14b", 14_770_033_664), ("deepseek-r1-distill-llama-8b", 8_030_261_248)])
def test_new_presets_have_their_published_sizes(name, params):
    # The counts on each model's HF page; test_config.py checks every preset against HF on the meta device.
    assert presets.config(name).num_parameters() == params


def test_zoo_add_then_convert_list_show_remove(tmp_path):
    env = {"PORT_ZOO_FILE": str(tmp_path / "cfg" / "zoo.json")}
    ckpt = tmp_path / "my ckpt"
    shutil.copytree(STORIES, ckpt)
    r = port("zoo", "add", "my-stories", "--hf", str(ckpt), env=env)
    assert r.returncode == 0 and "added my-stories: llama, 260.03K parameters" in r.stdout, r.stderr
    doc = json.loads((tmp_path / "cfg" / "zoo.json").read_text())
    assert doc["models"][0]["name"] == "my-stories" and doc["models"][0]["path"] == str(ckpt.resolve())
    listing = port("zoo", "list", env=env).stdout
    assert re.search(r"^my-stories \*\s+llama\s+260\.03K", listing, re.M) and "llama3.2-1b" in listing
    rows = json.loads(port("zoo", "list", "--json", env=env).stdout)
    assert [r["name"] for r in rows if r["user"]] == ["my-stories"]
    assert json.loads(port("zoo", "show", "my-stories", env=env).stdout)["config.json"]["hidden_size"] == 64
    out = tmp_path / "ms"
    conv = port("convert", "--hf", "my-stories", "--out", str(out), "-q", env=env)
    assert conv.returncode == 0 and (out / "model.safetensors").is_file(), conv.stderr
    # the same name twice, a built-in name, a bad name: one error line each, the registry unchanged
    for args, msg in ((["my-stories"], "already in"), (["llama-7b"], "is a built-in size"),
                      (["a/b"], "expected letters, digits")):
        bad = port("zoo", "add", *args, "--hf", str(ckpt), env=env)
        assert bad.returncode == 2 and msg in bad.stderr and "Traceback" not in bad.stderr
    assert json.loads((tmp_path / "cfg" / "zoo.json").read_text()) == doc
    assert port("zoo", "add", "my-stories", "--hf", str(ckpt), "--replace", env=env).returncode == 0
    assert port("zoo", "remove", "my-stories", env=env).returncode == 0
    gone = port("convert", "--hf", "my-stories", "--out", str(tmp_path / "ms2"), env=env)
    assert gone.returncode == 2 and "unknown zoo model 'my-stories'" in gone.stderr
    assert ckpt.is_dir(), "removing a name never touches the checkpoint"


def test_repo_ids_resolve_through_the_hf_cache(tmp_path, monkeypatch):
    from porting.model_paths import resolve_hf

    snap = tmp_path / "hub" / "models--someone--tiny" / "snapshots" / "abc123"
    shutil.copytree(STORIES, snap)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("PORT_ZOO_FILE", str(tmp_path / "zoo.json"))
    r = port("zoo", "add", "tiny", "--hf", "someone/tiny", env={"HF_HUB_CACHE": str(tmp_path / "hub"),
                                                               "PORT_ZOO_FILE": str(tmp_path / "zoo.json")})
    assert r.returncode == 0, r.stderr
    assert resolve_hf("tiny") == snap and presets.get("tiny")["hf_repo"] == "someone/tiny"
    missing = port("zoo", "add", "nope", "--hf", "someone/absent", env={"HF_HUB_CACHE": str(tmp_path / "hub"),
                                                                       "PORT_ZOO_FILE": str(tmp_path / "zoo.json")})
    assert missing.returncode == 2 and "not in the local HF cache" in missing.stderr


def test_broken_registry_and_moved_checkpoint_are_one_line_errors(tmp_path, monkeypatch):
    from porting.model_paths import resolve_hf

    reg = tmp_path / "zoo.json"
    monkeypatch.setenv("PORT_ZOO_FILE", str(reg))
    ckpt = tmp_path / "c"
    shutil.copytree(STORIES, ckpt)
    presets.add_user("c", json.loads((ckpt / "config.json").read_text()), path=str(ckpt), hf_repo=None)
    shutil.rmtree(ckpt)
    with pytest.raises(UnknownModelError, match="no config.json any more.*--replace"):
        resolve_hf("c")
    reg.write_text('{"models": [{"name": 3}]}')
    with pytest.raises(ConfigError, match="expected .*models.* as `port zoo add` writes it"):
        presets.names()
    with pytest.raises(ConfigError, match="unsupported architecture"):
        reg.unlink()
        presets.add_user("g", {"model_type": "gpt2", "n_embd": 8}, path=None, hf_repo="x/y")
    assert not reg.exists()


def test_library_snippet_runs_as_written(tmp_path):
    """docs/data.md's five lines, in a directory where `port convert` wrote ms-stories."""
    text = (ROOT / "docs" / "data.md").read_text()
    code = re.search(r"<!-- library-snippet -->\n```python\n(.*?)```", text, re.S).group(1)
    assert len(code.strip().splitlines()) == 5
    assert port("convert", "--hf", "stories260k", "--out", str(tmp_path / "ms-stories"), "-q", env={}).returncode == 0
    script = tmp_path / "snippet.py"
    script.write_text(code + "import json; print(json.dumps(ids))\n")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"})
    assert r.returncode == 0, r.stderr[-2000:]
    ids = json.loads(r.stdout.strip().splitlines()[-1])
    # shared/README.md's golden ids of stories260K after BOS
    assert ids[:10] == [403, 407, 261, 378, 432, 383, 286, 261, 376, 298] and len(ids) == 60


def _add_in_child(reg: str, name: str, cfg: dict) -> None:
    os.environ["PORT_ZOO_FILE"] = reg
    presets.add_user(name, cfg, path=None, hf_repo=f"org/{name}")


def test_sixteen_concurrent_adds_keep_sixteen_entries(tmp_path):
    """Sixteen processes add a name each at the same moment (the read-modify-write under the registry's
    lock): every name survives, and keys port does not know are kept."""
    import multiprocessing

    reg = tmp_path / "zoo.json"
    reg.write_text(json.dumps({"comment": "mine", "models": [
        {"name": "old", "hf_repo": "a/b", "path": None, "note": "kept",
         "hf_config": json.loads((STORIES / "config.json").read_text())}]}))
    cfg = json.loads((STORIES / "config.json").read_text())
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(16)

    def run(i: int) -> None:
        start.wait()
        _add_in_child(str(reg), f"m{i}", cfg)
    procs = [ctx.Process(target=run, args=(i,)) for i in range(16)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 16
    doc = json.loads(reg.read_text())
    assert sorted(m["name"] for m in doc["models"]) == sorted(["old"] + [f"m{i}" for i in range(16)])
    assert doc["comment"] == "mine" and doc["models"][0]["note"] == "kept"


def test_a_broken_registry_never_disables_the_built_ins(tmp_path):
    from porting.model_paths import resolve_hf

    reg = tmp_path / "zoo.json"
    reg.write_text('{"models": [{"name": 3}]}')
    env = {"PORT_ZOO_FILE": str(reg)}
    listing = port("zoo", "list", env=env)
    assert listing.returncode == 2 and "llama2-13b" in listing.stdout and "stories260k" in listing.stdout
    errors = [ln for ln in listing.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and str(reg) in errors[0] and "built-in names work meanwhile" in errors[0]
    os.environ["PORT_ZOO_FILE"] = str(reg)
    try:
        assert resolve_hf("stories260k") == STORIES and presets.known("llama-7b")
        with pytest.raises(ConfigError, match="expected"):
            resolve_hf("my-own")
    finally:
        del os.environ["PORT_ZOO_FILE"]
    assert reg.read_text() == '{"models": [{"name": 3}]}'


def test_the_registry_is_bounded_on_write(tmp_path, monkeypatch):
    """No sequence of `zoo add` makes a registry port then refuses to read: the add that would pass the
    bound is refused and the registry stays as it was."""
    monkeypatch.setenv("PORT_ZOO_FILE", str(tmp_path / "zoo.json"))
    monkeypatch.setattr(presets, "MAX_REGISTRY_BYTES", 4000)
    cfg = json.loads((STORIES / "config.json").read_text())
    presets.add_user("a", cfg, path=None, hf_repo="o/a")
    before = (tmp_path / "zoo.json").read_bytes()
    big = dict(cfg, padding="x" * 4000)
    with pytest.raises(ConfigError, match="would grow to .* more than the 4,000"):
        presets.add_user("b", big, path=None, hf_repo="o/b")
    assert (tmp_path / "zoo.json").read_bytes() == before and presets.names()[-1] == "a"


def test_a_30_mb_config_added_three_times_never_reaches_the_registry(tmp_path):
    """Issue 27: a 30 MB config.json added three times wrote a 94 MB registry that bricked every name. Each
    add is refused at the config.json bound (1 MiB), the registry keeps its one entry, built-ins resolve."""
    reg = tmp_path / "zoo.json"
    env = {"PORT_ZOO_FILE": str(reg)}
    assert port("zoo", "add", "small", "--hf", str(STORIES), env=env).returncode == 0
    before = reg.read_bytes()
    big = tmp_path / "big"
    shutil.copytree(STORIES, big)
    cfg = json.loads((big / "config.json").read_text())
    (big / "config.json").write_text(json.dumps({**cfg, "padding": "x" * (30 << 20)}))
    for name in ("big1", "big2", "big3"):
        r = port("zoo", "add", name, "--hf", str(big), env=env)
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert r.returncode == 2 and len(errors) == 1 and "more than the 1,048,576 allowed" in errors[0], r.stderr
    assert reg.read_bytes() == before
    listing = port("zoo", "list", env=env)
    assert listing.returncode == 0 and "small *" in listing.stdout and "llama2-13b" in listing.stdout
