"""``tokentrace compare``: two runs side by side, each change with a bootstrap interval and a
verdict, and where the mean E2E's change comes from (docs/compare.md).

numpy and scipy come with the ``compare`` extra (``pip install 'tokentrace[compare]'``);
importing this package without them raises a one-line :class:`~analyzer.errors.UserError`
naming the extra.
"""

from __future__ import annotations

from analyzer.errors import UserError

try:  # the extra's packages, checked once here so every entry point says the same line
    import numpy  # noqa: F401 - the compare extra, checked here
    import scipy.stats  # noqa: F401 - the compare extra, checked here
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the packages
    missing = (exc.name or "numpy").split(".")[0]
    raise UserError(f"tokentrace compare needs numpy and scipy ({missing} is not installed): "
                    "pip install 'tokentrace[compare]'") from None

from analyzer.compare.runs import CompareOptions, Comparison, ComparisonRow, compare_runs

__all__ = ["CompareOptions", "Comparison", "ComparisonRow", "compare_runs"]
