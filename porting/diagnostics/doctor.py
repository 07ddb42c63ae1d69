"""`port doctor`: the environment record and its checks (also written into every run's manifest).

Versions come from :func:`porting.env.versions`; compatibility pairs and environment knobs are data
(porting/data/compat.yaml, env_knobs.yaml). Works on a machine without an NPU and says so.
"""

from __future__ import annotations

import os
import re
import sys
from functools import lru_cache
from pathlib import Path

from porting import env
from porting.diagnostics import load_yaml

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"
# pyproject.toml's requires-python (">=3.9,<3.13"); CI runs 3.11 (full suite, compatibility tier) and 3.12
# (scripts/compat312.sh). tests/diagnostics/test_versions.py keeps the two equal.
PYTHONS = ((3, 9), (3, 10), (3, 11), (3, 12))


@lru_cache(maxsize=1)
def compat_table() -> dict:
    return load_yaml("compat.yaml")


@lru_cache(maxsize=1)
def knob_table() -> list[dict]:
    return load_yaml("env_knobs.yaml")


def _check(name: str, status: str, detail: str) -> dict:
    return {"check": name, "status": status, "detail": detail}


def _base(version: str | None) -> str | None:
    """'2.1.0.post10' -> '2.1.0'; '2.13.0+cpu' -> '2.13.0'; '2.6.0rc1' -> '2.6.0'."""
    if not version:
        return None
    m = re.match(r"(\d+\.\d+(?:\.\d+)?)", version)
    return m.group(1) if m else None


def _norm(v: str | None) -> str:
    return (v or "").replace("-", "").lower()


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", _base(v) or "0")[:3])


def pairing(ms: str | None, cann: str | None = None, driver: str | None = None) -> dict:
    """The known-good row for MindSpore ``ms`` (compat.yaml) and whether this machine matches it.

    ``known_good``: the row exists and, where CANN/HDK are installed, they equal the row's. ``supported``:
    ``ms`` lies in the range port installs into (pyproject.toml); ``tested``: the CI tier that runs it."""
    table = compat_table()
    rng = table["supported"]
    match = [r for r in table["mindspore"] if ms and (_norm(r["mindspore"]) == _norm(ms) or r["mindspore"] == _base(ms))]
    row = match[0] if match else None
    supported = bool(ms) and _version_key(rng["min"]) <= _version_key(ms) < _version_key(rng["below"])
    tested = next((t["tier"] for t in table["tested"] if ms and t["mindspore"] == _base(ms)), None)
    cann_ok = None if row is None or cann is None else _norm(cann).startswith(_norm(row["cann"]))
    driver_ok = None if row is None or driver is None else _norm(driver).startswith(_norm(row["driver"]))
    return {"mindspore": ms, "cann": cann, "driver": driver, "row": row, "supported": supported,
            "supported_range": f">={rng['min']},<{rng['below']}", "tested": tested,
            "known_good": row is not None and cann_ok is not False and driver_ok is not False,
            "cann_ok": cann_ok, "driver_ok": driver_ok}


def check_mindspore_cann(ms: str | None, cann: str | None, driver: str | None) -> list[dict]:
    """OK / FAIL for the installed MindSpore, CANN and HDK against compat.yaml, naming the exact
    CANN and HDK to install; without CANN (a CPU machine), which pairing the installed MindSpore needs."""
    if ms is None:
        return [_check("mindspore/cann", INFO, "MindSpore not installed")]
    p = pairing(ms, cann, driver)
    out = [_check("mindspore range", OK, f"MindSpore {ms} is in the range port supports ({p['supported_range']}); "
                                         + (f"CI runs its {p['tested']}" if p["tested"] else "not run by port's CI"))
           if p["supported"] else _check("mindspore range", WARN, f"MindSpore {ms} is outside the range port "
                                                                  f"supports ({p['supported_range']})")]
    row = p["row"]
    if p["supported"] and not p["tested"] and row is not None:
        out.append(_check("mindspore pairing", WARN, untested_line(ms, row)))
    out += [_check("mindspore changes", INFO, f"MindSpore {c['since']}: {c['note']}; {c['port']} ({c['source']})")
            for c in release_changes(ms)]
    if row is None:
        newest = compat_table()["mindspore"][0]["mindspore"]
        return out + [_check("mindspore/cann", INFO if cann is None else WARN,
                             f"MindSpore {ms} is not in the compatibility table (newest entry {newest}); "
                             f"its CANN/driver pairing is unverified" + ("" if cann else "; no CANN here (CPU-only)"))]
    need = f"CANN {row['cann']} and Ascend HDK {row['driver']} ({row['source']})"
    if cann is None:
        return out + [_check("mindspore/cann", INFO, f"MindSpore {ms} needs {need}; no CANN installed here "
                                                     f"(CPU-only)")]
    if not p["cann_ok"]:
        out.append(_check("mindspore/cann", FAIL, f"MindSpore {ms} is paired with CANN {row['cann']}, installed "
                                                  f"CANN is {cann}; install {need}, or the MindSpore this CANN "
                                                  f"pairs with ({_mindspore_for(cann)})"))
    else:
        out.append(_check("mindspore/cann", OK, f"MindSpore {ms} with CANN {cann}"))
    if driver is not None and not p["driver_ok"]:
        out.append(_check("cann/driver", FAIL, f"CANN {row['cann']} is released with Ascend HDK {row['driver']}, "
                                               f"installed driver is {driver}; install Ascend HDK {row['driver']}"))
    elif driver is not None:
        out.append(_check("cann/driver", OK, f"driver {driver}"))
    return out


def untested_line(ms: str, row: dict) -> str:
    """The one line for a supported MindSpore that no CI tier runs (manifest: doctor.untested_pairing)."""
    where = "MindSpore Transformers' VERSION_MAP" if "VERSION_MAP" in row["source"] else row["source"]
    return (f"untested pairing: MindSpore {ms} is paired with CANN {row['cann']} / HDK {row['driver']} ({where}), "
            f"not run by port's CI")


def release_changes(ms: str | None) -> list[dict]:
    """compat.yaml's notes on what MindSpore releases change that port calls, for the releases up to ``ms``
    that are newer than every tested one (a tested release already ran port's tests)."""
    if not ms:
        return []
    newest = max(_version_key(t["mindspore"]) for t in compat_table()["tested"])
    return [c for c in compat_table().get("mindspore_changes", [])
            if newest < _version_key(c["since"]) <= _version_key(ms)]


def _mindspore_for(cann: str) -> str:
    """The MindSpore release(s) compat.yaml pairs with an installed CANN, for the FAIL message."""
    names = [r["mindspore"] for r in compat_table()["mindspore"] if _norm(cann).startswith(_norm(r["cann"]))]
    return "MindSpore " + " or ".join(names) if names else f"no MindSpore in the table pairs with CANN {cann}"


def check_torch_npu(torch: str | None, torch_npu: str | None) -> list[dict]:
    if torch_npu is None:
        if torch is None:
            return [_check("torch/torch_npu", INFO, "neither torch nor torch_npu installed")]
        known = _known_torch_versions()
        tv = _base(torch)
        mm = ".".join((tv or "").split(".")[:2])
        listed = f"v{mm}" in known
        return [_check("torch/torch_npu", INFO,
                       f"torch {torch} without torch_npu (CPU/CUDA reference only); torch {mm} is "
                       + ("a torch_npu target in the op-plugin registry" if listed
                          else f"NOT a torch_npu target in the op-plugin registry ({', '.join(known)})"))]
    if torch is None:
        return [_check("torch/torch_npu", FAIL, f"torch_npu {torch_npu} is installed without torch; install "
                                                f"torch {_base(torch_npu)}")]
    if _base(torch) != _base(torch_npu):
        return [_check("torch/torch_npu", FAIL, f"torch_npu {torch_npu} requires torch {_base(torch_npu)}, "
                                                f"installed torch is {torch}")]
    return [_check("torch/torch_npu", OK, f"torch {torch} with torch_npu {torch_npu}")]


def msprobe_note(ms: str | None) -> str | None:
    """A warning when the installed MindSpore is not a release msprobe's own version table lists
    (compat.yaml tools.msprobe); None when it is, or when MindSpore is not installed."""
    tool = compat_table()["tools"]["msprobe"]
    if not ms or _base(ms) in tool["mindspore"]:
        return None
    return (f"warning: msprobe's version table lists MindSpore {', '.join(tool['mindspore'])}; the installed "
            f"MindSpore {ms} is not among them, so msprobe's MindSpore dump may not run ({tool['source']}); "
            f"the mapping file itself does not depend on it")


@lru_cache(maxsize=1)
def _known_torch_versions() -> list[str]:
    from porting.diagnostics.opscan import registry_versions

    return registry_versions()


def env_knobs(environ: dict[str, str] | None = None) -> list[dict]:
    environ = dict(os.environ if environ is None else environ)
    rows = []
    for k in knob_table():
        val = environ.get(k["name"])
        rows.append({"name": k["name"], "value": val, "default": k.get("default"),
                     "in_effect": val if val is not None else k.get("default"),
                     "set": val is not None, "unit": k.get("unit"), "meaning": k["meaning"],
                     "source": k["source"], "problem": _knob_problem(k, val)})
    return rows


def _integer(val: object) -> int | None:
    """``val`` as an integer when it is one written in ASCII digits (an optional minus), else None."""
    text = str(val).strip() if val is not None else ""
    return int(text) if re.fullmatch(r"-?[0-9]{1,18}", text) else None


def _knob_problem(knob: dict, val: str | None) -> str | None:
    if val is None:
        return None
    kind = knob["type"]
    if kind == "int" and _integer(val) is None:   # ASCII digits: int() and \d take any script's ("١٢٠" is 120)
        return f"{knob['name']}={val!r} is not an integer (ASCII digits 0-9)"
    if kind == "list" and val.strip() and not all(re.fullmatch(r"[\w.]+:[\w.]+", p.strip())
                                                  for p in val.split(",") if p.strip()):
        return f"{knob['name']}={val!r}: expected comma-separated key:value pairs"
    if kind == "path":
        shown = val if len(val) <= 120 else f"{val[:60]}...({len(val):,} characters)"
        try:
            os.stat(os.path.expanduser(val))
        except FileNotFoundError:
            return f"{knob['name']}={shown!r}: no such file"
        except (OSError, ValueError) as e:   # longer than the file-name limit, a NUL byte, no permission
            return f"{knob['name']}={shown!r}: the path cannot be used ({getattr(e, 'strerror', None) or e})"
    return None


def check_env(rows: list[dict]) -> list[dict]:
    out = [_check(f"env {r['name']}", FAIL, r["problem"]) for r in rows if r["problem"]]
    by = {r["name"]: r for r in rows}
    try:
        conn = _integer(by["HCCL_CONNECT_TIMEOUT"]["in_effect"])
        exe = _integer(by["HCCL_EXEC_TIMEOUT"]["in_effect"])
        if conn is not None and exe is not None and exe != 0 and conn >= exe:
            out.append(_check("env HCCL timeouts", WARN, f"HCCL_CONNECT_TIMEOUT {conn} >= HCCL_EXEC_TIMEOUT {exe}; "
                                                          f"the HCCL guide advises connect < exec so the first error "
                                                          f"is reported by the right rank"))
    except (TypeError, ValueError):
        pass
    rt = by.get("RANK_TABLE_FILE", {}).get("value")
    if rt and not by["RANK_TABLE_FILE"]["problem"] and Path(rt).is_file():
        from porting.diagnostics import DiagnosticsError
        from porting.cluster import ranktable

        try:
            errs = ranktable.errors_of(ranktable.check(ranktable.load(rt)))
            out.append(_check("RANK_TABLE_FILE", FAIL if errs else OK,
                              f"{rt}: " + (f"{len(errs)} error(s), first: {errs[0]}" if errs else "valid")))
        except DiagnosticsError as e:
            out.append(_check("RANK_TABLE_FILE", FAIL, str(e)))
    return out


def npu_chips(text: str) -> list[str]:
    """The chip name of every device row of ``npu-smi info``'s table (``| 0     910B3    | OK ...``); an
    Atlas A3 node lists each 910C die as its own row. Bounded: only the first 64 KiB are read."""
    return [t for _, t in re.findall(r"^\|\s*(\d+)\s+(9\w+|Ascend\w*|310\w*)\s*\|", text[:65536], re.M)]


def npu_status() -> dict:
    """NPU type and count from npu-smi when present."""
    text = env.npu_smi()
    if text is None:
        return {"present": False, "count": 0, "types": [], "detail": "no NPU: npu-smi not found or failed "
                "(a CPU-only machine); Ascend kernels and HCCL cannot run here"}
    chips = npu_chips(text)
    types = sorted(set(chips))
    return {"present": True, "count": len(chips), "types": types,
            "detail": f"{len(chips)} NPU(s): {', '.join(types) or 'type not parsed'}"}


def chip_family(name: str) -> dict | None:
    """compat.yaml's ``devices`` row for an npu-smi chip name (first pattern that matches), else None."""
    return next((d for d in compat_table()["devices"] if re.match(d["pattern"], name)), None)


def training_device_check(types: list[str]) -> dict | None:
    """FAIL when a chip of this node cannot train (310P/310B/310: inference only), naming the chip and what to
    use instead; WARN for a chip compat.yaml does not know; None when every chip trains or there is no NPU."""
    if not types:
        return None
    rows = {t: chip_family(t) for t in types}
    bad = [t for t, r in rows.items() if r is not None and not r["train"]]
    if bad:
        t = bad[0]
        return _check("npu training", FAIL, f"this node's NPU is {t}, an {rows[t]['family']} chip that cannot "
                                            f"train; training needs {compat_table()['train_instead']}")
    unknown = [t for t, r in rows.items() if r is None]
    if unknown:
        return _check("npu training", WARN, f"NPU {', '.join(unknown)} is not in port's device table (porting/data/"
                                            f"compat.yaml devices); port targets 910B and 910C (Atlas A2/A3)")
    return _check("npu training", OK, ", ".join(f"{t}: {rows[t]['family']}" for t in types))


def require_training_device() -> None:
    """`port train` on an Ascend recipe: stop before anything runs when this node's chips cannot train (one
    line naming the chip and what to use instead). A machine without npu-smi (planning on a laptop) passes."""
    text = env.npu_smi()
    check = training_device_check(sorted(set(npu_chips(text)))) if text is not None else None
    if check is not None and check["status"] == FAIL:
        from model_zoo.errors import ConfigError

        raise ConfigError(f"npu-smi: {check['detail']}")


def doctor_report(environ: dict[str, str] | None = None) -> dict:
    """Versions, NPU, compatibility checks and env knobs; what `port train` writes into its manifest."""
    v = env.versions()
    pk = v["packages"]
    npu = npu_status()
    checks = [_check("python", OK if sys.version_info[:2] in PYTHONS else WARN,
                     f"Python {v['python']} (supported {'.'.join(map(str, PYTHONS[0]))}-"
                     f"{'.'.join(map(str, PYTHONS[-1]))})")]
    checks.append(_check("npu", OK if npu["present"] else INFO, npu["detail"]))
    train_check = training_device_check(npu["types"])
    checks += [train_check] if train_check else []
    for name in ("mindspore", "transformers", "safetensors", "numpy"):
        checks.append(_check(name, OK if pk.get(name) else FAIL,
                             f"{name} {pk[name]}" if pk.get(name) else f"{name} is not installed; pip install {name}"))
    np_v = pk.get("numpy")
    if np_v and np_v.split(".")[0] >= "2" and pk.get("mindspore"):
        checks.append(_check("numpy<2", WARN, f"numpy {np_v}: MindSpore 2.10 cannot save bfloat16 checkpoints under "
                                              f"NumPy 2; install numpy<2"))
    checks += check_mindspore_cann(pk.get("mindspore"), v.get("cann"), v.get("ascend_driver"))
    checks += check_torch_npu(pk.get("torch"), pk.get("torch_npu"))
    checks.append(_check("mindspeed", OK if pk.get("mindspeed") else INFO,
                         f"mindspeed {pk['mindspeed']}" if pk.get("mindspeed")
                         else "MindSpeed not installed (optional; installed from source on Ascend machines)"))
    knobs = env_knobs(environ)
    checks += check_env(knobs)
    untested = next((c["detail"] for c in checks if c["check"] == "mindspore pairing"), None)
    return {"versions": v, "firmware": env.firmware_version(), "npu": npu, "checks": checks, "env": knobs,
            "determinism": determinism_switches(environ, v.get("cann"), npu["present"]),
            "pairing": pairing(pk.get("mindspore"), v.get("cann"), v.get("ascend_driver")),
            "untested_pairing": untested, "ok": not any(c["status"] == FAIL for c in checks)}


def determinism_switches(environ: dict[str, str] | None, cann: str | None, npu: bool) -> dict:
    """The determinism switches in force in this environment (``determinism: bitwise`` sets the unset ones in each
    rank and refuses a contradicting value: porting/train/recipe/determinism.py)."""
    from porting.train.recipe.determinism import SWITCHES, cann_level

    e = dict(os.environ if environ is None else environ)
    device = "ascend" if npu else "cpu"
    return {"switches": {s.name: e.get(s.name, "unset") for s in SWITCHES},
            "undone": [s.name for s in SWITCHES if s.name in e and e[s.name] not in s.accepts],
            "cann_batch_consistency": cann_level(cann, device)[1]}


def determinism_line(d: dict | None) -> str:
    """The switches line of `port doctor`."""
    if not d:
        return "determinism switches: not recorded"
    sw = " ".join(f"{k}={v}" for k, v in d["switches"].items())
    undone = f"; {', '.join(d['undone'])} set to a value determinism: bitwise refuses" if d["undone"] else ""
    return (f"determinism switches in force: {sw}; CANN batch consistency: {d['cann_batch_consistency']}{undone} "
            "(a `determinism: bitwise` recipe sets the unset ones and MindSpore's deterministic mode in each rank)")


def render_text(rep: dict) -> str:
    v = rep["versions"]
    out = [f"port doctor: Python {v['python']} on {v['platform']}",
           f"NPU: {rep['npu']['detail']}",
           f"CANN: {v.get('cann') or 'not installed'}   driver: {v.get('ascend_driver') or 'not installed'}   "
           f"firmware: {rep.get('firmware') or 'not installed'}",
           "packages: " + ", ".join(f"{k} {val or '-'}" for k, val in v["packages"].items()), "", "checks:"]
    for c in rep["checks"]:
        out.append(f"  [{c['status']:>4}] {c['check']:<22} {c['detail']}")
    out += ["", "environment (value in effect; * = set here, otherwise the documented default):"]
    for r in rep["env"]:
        val = r["in_effect"]
        val = val if val is None or len(str(val)) <= 120 else f"{str(val)[:60]}...({len(str(val)):,} characters)"
        shown = "unset" if val is None else f"{val}{' ' + r['unit'] if r.get('unit') else ''}"
        out.append(f"  {'*' if r['set'] else ' '} {r['name']:<28} {shown:<14} {r['meaning']}")
    out += ["", determinism_line(rep.get("determinism")), ""]
    out.append("result: " + ("ok" if rep["ok"] else "problems found (see [fail] above)"))
    return "\n".join(out)
