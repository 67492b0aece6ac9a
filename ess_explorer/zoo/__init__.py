"""The built-in zoo: tiny models trained on multi-query associative recall (MQAR).

Importing this package registers the project's own linear-attention family with transformers.
"""

from . import modeling  # noqa: F401  (registers model_type "ess_linear_attention")
