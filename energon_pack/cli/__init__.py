"""The ``energon-pack`` command line (the tools wing): :func:`main` is the console script.

One module per command (``demo``, ``make_demo``, ``prepare``, ``bench``, ``bench_packing``,
``bench_pixels``, ``bench_sft``, ``bench_offline``, ``inspect``, ``pack_offline``; ``convert`` a
package of its own), assembled in :mod:`.main`; what they share in :mod:`.common` and
:mod:`.options`, how library errors read in :mod:`.wording`, Ctrl-C in :mod:`.interrupt`.
Heavy libraries are imported inside each command's ``run``, so ``--help`` stays cheap.
"""

from __future__ import annotations

from .common import CliError, demo_dataset, ensure_demo_data
from .main import build_parser, main

__all__ = ["CliError", "build_parser", "demo_dataset", "ensure_demo_data", "main"]
