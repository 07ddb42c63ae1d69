"""`port diverge RUN_A RUN_B`: the first step, layer, tensor and phase where two runs part (docs/diverge.md).

Reads the fingerprints both runs wrote (porting/rundir/fingerprints.py: `port train` with
``logging.fingerprint_every``, `port baseline run` beside its file), refuses two runs that did not see the same
batches, and walks the common sampled steps in execution order (``compare.py``)."""
