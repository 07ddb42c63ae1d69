"""The order of HCCL's two timeouts: link set-up must give up before execution does.

The HCCL fault-diagnosis guide (hicann/hccl docs/zh/user_guide/fault_diagnosis/debug_thinking.md, "HCCL_CONNECT_TIMEOUT、
HCCL_EXEC_TIMEOUT") advises HCCL_CONNECT_TIMEOUT < HCCL_EXEC_TIMEOUT, "so that in complex cases the first error
is reported correctly, telling whether a blocked process waits on its own side or on the remote side". HCCL's
defaults are 120 s and 1836 s (the same guide's run-log example: "HCCL_CONNECT_TIMEOUT set by default to [120]s",
"HCCL_EXEC_TIMEOUT set by default to [1836]s"); HCCL_EXEC_TIMEOUT=0 means never. Since CANN 8.2 the link set-up
actually waits HCCL_CONNECT_TIMEOUT + 20 s (CANN environment-variable reference, envref_07_0077).

`port train` sets both for multi-device runs from its plan (porting/train/plan/comm.py; always in order) unless the
user's environment sets them, and the user's values win: so the order breaks only by hand. This module checks the
values in effect: the environment's, else the plan's, else HCCL's defaults.
"""

from __future__ import annotations

from typing import Mapping

CONNECT, EXEC = "HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT"
HCCL_DEFAULTS = {CONNECT: 120, EXEC: 1836}
CONNECT_GRACE_S = 20     # HCCL waits HCCL_CONNECT_TIMEOUT + 20 s (CANN 8.2+ envref_07_0077)
REASON = ("the HCCL guide asks for HCCL_CONNECT_TIMEOUT < HCCL_EXEC_TIMEOUT so that the first error is reported "
          "correctly (whether a blocked process waits on its own side or on the remote one); with the order "
          "inverted, ranks still waiting to build links outlast the collective timeout and the first error points "
          "at the wrong rank")


def in_effect(env: Mapping[str, str], plan_env: Mapping[str, str] | None = None) -> dict[str, tuple[int | None, str]]:
    """name -> (seconds, where from: 'environment' | 'plan' | 'HCCL default'); None when a value is not an integer."""
    out: dict[str, tuple[int | None, str]] = {}
    for name in (CONNECT, EXEC):
        for source, table in (("environment", env), ("plan", plan_env or {})):
            raw = table.get(name)
            if raw is not None and str(raw).strip():
                text = str(raw).strip()
                # ASCII digits only: int() takes any script's digits ("١٢٠" is 120), HCCL does not
                out[name] = (int(text) if text.isascii() and text.lstrip("-").isdigit() and len(text) <= 18 else None,
                             source)
                break
        else:
            out[name] = (HCCL_DEFAULTS[name], "HCCL default")
    return out


def check(env: Mapping[str, str], plan_env: Mapping[str, str] | None = None) -> dict:
    """A preflight row: ``warn`` when HCCL_CONNECT_TIMEOUT >= HCCL_EXEC_TIMEOUT in effect (or not an integer)."""
    vals = in_effect(env, plan_env)
    (conn, csrc), (exe, esrc) = vals[CONNECT], vals[EXEC]
    said = f"{CONNECT}={conn} ({csrc}), {EXEC}={exe} ({esrc})"
    if conn is None or exe is None:
        return {"check": "HCCL timeouts", "status": "warn",
                "detail": f"{said}: not an integer; set whole seconds (HCCL's defaults: 120 and 1836)"}
    if exe != 0 and conn >= exe:
        return {"check": "HCCL timeouts", "status": "warn",
                "detail": f"{said}: connect >= exec; {REASON}; set {CONNECT} below {EXEC} (for example "
                          f"{CONNECT}={max(120, exe // 3)} or raise {EXEC}) on every node"}
    if exe != 0 and conn + CONNECT_GRACE_S >= exe:
        return {"check": "HCCL timeouts", "status": "warn",
                "detail": f"{said}: HCCL waits {conn + CONNECT_GRACE_S} s for links ({CONNECT} + {CONNECT_GRACE_S} s), "
                          f"not below {EXEC}; {REASON}"}
    return {"check": "HCCL timeouts", "status": "ok",
            "detail": f"{said}: connect < exec" + (" (exec 0: collectives never time out)" if exe == 0 else "")}


def plan_line(env: Mapping[str, str], plan_env: Mapping[str, str]) -> str:
    """One line for `port train --dry-run`: the timeouts the job will run with, and whether they are in order."""
    row = check(env, plan_env)
    return ("HCCL timeouts in effect: " if row["status"] == "ok" else "warning: HCCL timeouts in effect: ") + row["detail"]
