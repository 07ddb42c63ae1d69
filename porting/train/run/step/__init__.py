"""One rank's training step: what it builds before step 1 (``setup``: its place in the job, the data, the model),
MindSpore's process-wide setup (``runtime``, ``execution``), the step cells (``cells``: forward, backward, the
gradient reduction, clip and AdamW; ``zero``: the sharded optimizer; ``grid``: tensor-parallel ranks), loss scaling
and non-finite steps, the precompile before step 1 (``precompile``, ``ready``, ``shared_cache``) and what a step
measures (``breakdown``, ``commwait``, ``result``). The checkpoint is ``porting/train/run/checkpoint/``."""
