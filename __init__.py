"""The clone's root folder, found as ``energon_pack`` when Python runs from the folder that holds the clone.

With a script or ``python`` started in that parent folder, ``import energon_pack`` finds this folder before
the installed package, and without this file it imports as an empty namespace package: ``ImportError: cannot
import name ... (unknown location)``. This file turns that into one line naming the fix. Tools started inside
the clone (pytest imports the rootdir's ``__init__.py`` under the rootdir's name) get the real package in its
place, so they run as before. Never part of the installed package (pyproject packages only ``energon_pack*``).
"""

import importlib.util
import os
import sys
from pathlib import Path

_CLONE = Path(__file__).absolute().parent
_PACKAGE = _CLONE / "energon_pack" / "__init__.py"

if __name__ == "energon_pack" and _PACKAGE.is_file():
    if not Path.cwd().resolve().is_relative_to(_CLONE.resolve()):
        raise ImportError(
            f"energon_pack: {_CLONE} is the clone's folder, not the package: Python looks in {_CLONE.parent} first "
            f"(your script's or current folder); move the script or cd out of it, or rename the clone folder"
        )
    # started inside the clone (pytest's rootdir import): the real package takes this module's place
    _spec = importlib.util.spec_from_file_location(
        __name__, _PACKAGE, submodule_search_locations=[os.fspath(_PACKAGE.parent)]
    )
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[__name__] = _module
    _spec.loader.exec_module(_module)
