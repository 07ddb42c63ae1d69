"""Does the MindSpore cell match torch? One family of answers (docs/architecture.md, "How verification works"):

- :mod:`~porting.verify.pair`: the HF reference and the zoo cell from one directory (the one HF loader);
- :mod:`~porting.verify.stats`: the one difference function (``compare``) and the one tolerance table;
- :mod:`~porting.verify.check`: the one result row (``Check``) every verification prints;
- :mod:`~porting.verify.parity`, :mod:`~porting.verify.roundtrip`, :mod:`~porting.verify.generation`,
  :mod:`~porting.verify.evaluate`: the checks; :mod:`~porting.verify.model`: `port verify`, all of them.

The layer-by-layer search for where the two part is :mod:`porting.bisect`, built on these.
"""
