"""The ecosystem tests import their shared helpers (differential.py) from this folder."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
