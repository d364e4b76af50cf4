"""The zoo's tests import their shared helpers (zoo.py) from this folder."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
