"""Test-session settings for tests/python."""

import os

# torch and OpenMLA's CPU backend share one OpenMP runtime in a process; with the default
# (spinning) wait policy, alternating small torch and OpenMLA parallel regions on a 2-core machine
# stalls for tens of milliseconds per call (the transformers integration tests: 80 s instead of
# 15 s). Sleeping idle threads removes that. Set before torch or openmla load libgomp.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
