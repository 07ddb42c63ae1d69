"""One device's health, in a process of its own: ``python -m porting.launch.device_probe cpu|ascend ID``.

The probe opens device ``ID`` (Ascend: through ``ASCEND_RT_VISIBLE_DEVICES=ID``, so the process sees that
die as its device 0, as msrun's workers see theirs) and runs a real computation on it: a 256 x 256 fp32
matmul checked against NumPy. It exits 0 when the device answered correctly, else 1 with one
``error:`` line. A device whose driver or HBM is gone fails to open or to run the kernel; a device that
hangs is stopped by the caller's deadline (porting/launch/shrink.py).

``PORT_TEST_BAD_DEVICES=2,5`` (porting/train/run/faults.py) makes the probe of those ids fail without touching
the device: a fault injection for tests, since a CPU has no device that can break. Off unless set.
"""

from __future__ import annotations

import os
import sys

from model_zoo.errors import PortingError
from porting.train.run import faults


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("cpu", "ascend") or not argv[1].isdigit():
        print("error: usage: python -m porting.launch.device_probe cpu|ascend DEVICE_ID", file=sys.stderr)
        return 2
    device, did = argv[0], int(argv[1])
    try:
        bad = did in faults.active().bad_devices
    except PortingError as e:   # a test hook that does not parse: the probe cannot say anything about the device
        print(f"error: {e}", file=sys.stderr)
        return 2
    if bad:
        print(f"error: device {did}: marked bad by PORT_TEST_BAD_DEVICES (a test hook)", file=sys.stderr)
        return 1
    if device == "ascend":
        os.environ["ASCEND_RT_VISIBLE_DEVICES"] = str(did)   # before MindSpore opens any device
    import numpy as np
    import mindspore as ms

    try:
        ms.set_device("Ascend" if device == "ascend" else "CPU")
        a = np.random.default_rng(did).standard_normal((256, 256)).astype(np.float32)
        got = ms.ops.matmul(ms.Tensor(a), ms.Tensor(a)).asnumpy()
    except Exception as e:   # noqa: BLE001 - whatever the runtime raises, the answer is "this device failed"
        print(f"error: device {did}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
              file=sys.stderr)
        return 1
    want = a.astype(np.float64) @ a.astype(np.float64)
    err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    if not err < 1e-4:
        print(f"error: device {did}: a 256 x 256 matmul is off by {err:.3g} relative (expected < 1e-4)",
              file=sys.stderr)
        return 1
    print(f"device {did}: ok (matmul relative error {err:.2g})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
