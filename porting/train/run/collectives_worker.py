"""Entry point of one `msrun` worker of the compute rung's collective timing (porting/rehearse_compute.py):
``msrun ... collectives_worker.py SPEC OUT``. A file of its own in this folder because msrun runs a script
path, and a script in ``porting/`` itself would put that folder first on ``sys.path``, where ``porting/bisect``
hides the standard library's ``bisect``."""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[3]
    if str(root) not in sys.path:   # a source checkout run without installing the package
        sys.path.insert(0, str(root))
    from porting.rehearse_compute import collectives_child  # deferred: sys.path holds the checkout only from here

    collectives_child(argv[0], argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
