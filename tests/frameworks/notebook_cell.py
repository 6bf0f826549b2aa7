"""A notebook whose kernel started without ``RNGAUDIT``: its first cell sets the variable and
arms the audit, a later cell calls ``notebook_launcher`` (``fork_train.py notebook SEED``).

``MODE SEED``: the ``RNGAUDIT`` value, and ``fork_train.py``'s SEED.
"""

from __future__ import annotations

import os
import runpy
import sys

# -- cell 1 --
os.environ["RNGAUDIT"] = sys.argv[1]
import rngaudit.startup

rngaudit.startup.process_startup()

# -- cell 2 --
HERE = os.path.dirname(os.path.abspath(__file__))
sys.argv = [os.path.join(HERE, "fork_train.py"), "notebook", sys.argv[2]]
runpy.run_path(sys.argv[0], run_name="__main__")
