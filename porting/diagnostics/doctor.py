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


def _knob_problem(knob: dict, val: str | None) -> str | None:
    if val is None:
        return None
    kind = knob["type"]
    if kind == "int" and not re.fullmatch(r"-?\d+", val.strip()):
        return f"{knob['name']}={val!r} is not an integer"
    if kind == "list" and val.strip() and not all(re.fullmatch(r"[\w.]+:[\w.]+", p.strip())
                                                  for p in val.split(",") if p.strip()):
        return f"{knob['name']}={val!r}: expected comma-separated key:value pairs"
    if kind == "path" and not Path(os.path.expanduser(val)).exists():
        return f"{knob['name']}={val!r}: no such file"
    return None


def check_env(rows: list[dict]) -> list[dict]:
    out = [_check(f"env {r['name']}", FAIL, r["problem"]) for r in rows if r["problem"]]
    by = {r["name"]: r for r in rows}
    try:
        conn = int(by["HCCL_CONNECT_TIMEOUT"]["in_effect"])
        exe = int(by["HCCL_EXEC_TIMEOUT"]["in_effect"])
        if exe != 0 and conn >= exe:
            out.append(_check("env HCCL timeouts", WARN, f"HCCL_CONNECT_TIMEOUT {conn} >= HCCL_EXEC_TIMEOUT {exe}; "
                                                          f"the HCCL guide advises connect < exec so the first error "
                                                          f"is reported by the right rank"))
    except (TypeError, ValueError):
        pass
    rt = by.get("RANK_TABLE_FILE", {}).get("value")
    if rt and Path(rt).is_file():
        from porting.diagnostics import DiagnosticsError
        from porting.cluster import ranktable

        try:
            errs = ranktable.errors_of(ranktable.check(ranktable.load(rt)))
            out.append(_check("RANK_TABLE_FILE", FAIL if errs else OK,
                              f"{rt}: " + (f"{len(errs)} error(s), first: {errs[0]}" if errs else "valid")))
        except DiagnosticsError as e:
            out.append(_check("RANK_TABLE_FILE", FAIL, str(e)))
    return out


def npu_status() -> dict:
    """NPU type and count from npu-smi when present."""
    text = env.npu_smi()
    if text is None:
        return {"present": False, "count": 0, "types": [], "detail": "no NPU: npu-smi not found or failed "
                "(a CPU-only machine); Ascend kernels and HCCL cannot run here"}
    chips = re.findall(r"^\|\s*(\d+)\s+(9\w+|Ascend\w*|310\w*)\s*\|", text, re.M)
    types = sorted({t for _, t in chips})
    return {"present": True, "count": len(chips), "types": types,
            "detail": f"{len(chips)} NPU(s): {', '.join(types) or 'type not parsed'}"}


def doctor_report(environ: dict[str, str] | None = None) -> dict:
    """Versions, NPU, compatibility checks and env knobs; what `port train` writes into its manifest."""
    v = env.versions()
    pk = v["packages"]
    npu = npu_status()
    checks = [_check("python", OK if sys.version_info[:2] in ((3, 9), (3, 10), (3, 11)) else WARN,
                     f"Python {v['python']} (supported 3.9-3.11)")]
    checks.append(_check("npu", OK if npu["present"] else INFO, npu["detail"]))
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
    return {"versions": v, "firmware": env.firmware_version(), "npu": npu, "checks": checks, "env": knobs,
            "pairing": pairing(pk.get("mindspore"), v.get("cann"), v.get("ascend_driver")),
            "ok": not any(c["status"] == FAIL for c in checks)}


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
        shown = "unset" if r["in_effect"] is None else f"{r['in_effect']}{' ' + r['unit'] if r.get('unit') else ''}"
        out.append(f"  {'*' if r['set'] else ' '} {r['name']:<28} {shown:<14} {r['meaning']}")
    out.append("")
    out.append("result: " + ("ok" if rep["ok"] else "problems found (see [fail] above)"))
    return "\n".join(out)
