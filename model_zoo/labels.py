"""The label convention of every loss in port: a position labelled :data:`IGNORE_INDEX` takes no loss (prompt
tokens, padding). -100 is the default ``ignore_index`` of torch's ``cross_entropy``, which HF transformers'
causal-LM loss uses, so the torch baseline and the MindSpore loss read the same labels.
"""

IGNORE_INDEX = -100
