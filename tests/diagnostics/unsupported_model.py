"""A small torch model with a deliberately unsupported op, for `port ops scan --module`.

``torch.lgamma`` has no torch_npu kernel (not in op-plugin's registry) and its backward needs
``digamma``, which has none either: the scan must report both, forward and backward.
"""

from __future__ import annotations


def build():
    import torch

    class GammaHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(8, 4)

        def forward(self, x, labels=None):
            h = self.proj(x)
            y = torch.lgamma(h.abs() + 1.0)  # the unsupported op
            return {"loss": y.mean()}

    torch.manual_seed(0)
    return GammaHead(), {"x": torch.randn(3, 8)}
