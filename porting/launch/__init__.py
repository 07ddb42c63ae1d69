"""Where processes live: the wing of `port` that starts, watches and stops them, between the CLI (porting/cli)
and the training library (porting/train/).

- ``children``: the one builder of a child's environment and the one teardown of a process group;
- ``msrun``: a node's msrun launch (`port train` with more than one device);
- ``lifeline``: the launcher's side of "the processes port starts die with it" (the worker's side is
  porting/train/run/lifeline.py); ``detached``: a ``--join=False`` msrun as one process;
- ``outcome``: whether a launch finished or failed, and what a failed one left, for both launch paths;
- ``watch``, ``supervise``, ``nodes``, ``session``: `port train --supervise` (the heartbeats, the incidents, the
  supervisors of several nodes, this node's launches); ``shrink`` and ``device_probe``: a relaunch on fewer devices;
- ``proctable``: the process table (/proc).

Imports go one way: this package imports porting/train/, porting/rundir/ and the packages below them; nothing
there imports it. The CLI, the preflight (porting/cluster/) and the rehearsal import it. What sits above it (`port
diagnose`) is passed in (``supervise(diagnose=...)``). tests/test_house_rules.py keeps these rules.
"""
