"""The names of the zoo claim's tests, in one place: zoo/claim.py records every test under
them, and the cards (zoo/cards.py) and notebook 03 look them up in the record.

A test compares Spearman(predictor, accuracy) with Spearman(TSS/kv, accuracy) over a group of
(model, K, seed) points: "[main_task] mean: ESS/kv - TSS/kv" (group, the aggregation of ESS
over t, the predictor), or "[main_task without mamba2] mean: ..." (a family left out).
"""

from __future__ import annotations

__all__ = ["PRIMARY", "QUANTITY_NAMES", "comparison_name", "test_name"]

PRIMARY = "mean"  # the aggregation of the primary test and of the per-family (leave one out) tests
QUANTITY_NAMES = {"ess": "ESS/kv", "entropy_ess": "entropy-ESS/kv", "tss": "TSS/kv"}


def comparison_name(aggregation: str, quantity: str = "ess") -> str:
    """ "mean: ESS/kv - TSS/kv": the predictor ``quantity`` aggregated over t by ``aggregation``,
    against TSS/kv aggregated the same way."""
    return f"{aggregation}: {QUANTITY_NAMES[quantity]} - TSS/kv"


def test_name(group: str, comparison: str, without: str | None = None) -> str:
    """The record's name of ``comparison`` (`comparison_name`) over ``group`` ("all",
    "main_task"), with the family ``without`` left out, if given."""
    return f"[{group}{f' without {without}' if without else ''}] {comparison}"
