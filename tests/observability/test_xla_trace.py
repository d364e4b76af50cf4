"""torch_pjrt.profiler.trace(dir): XLA's own profile of a region, in the JAX profiler's
format."""

import glob
import os

import jax
import torch

import torch_pjrt


def test_trace_writes_xlas_profile_of_the_region(tmp_path):
    x = torch.randn(32, 32).to("pjrt")
    with torch_pjrt.profiler.trace(str(tmp_path)) as where:
        (x @ x).relu().sum().item()
    assert where == str(tmp_path)
    (path,) = glob.glob(os.path.join(tmp_path, "plugins", "profile", "*", "*.xplane.pb"))
    data = jax.profiler.ProfileData.from_file(path)
    names = [e.name for plane in data.planes for line in plane.lines for e in line.events]
    assert any("Execute" in n for n in names)  # XLA ran the region's program
