"""Experiment tracking through accelerate (Trackio, W&B, TensorBoard) and the run directory.

Import from the modules: ``rundir`` (the run directory's format, stdlib only, so reading a run directory loads
nothing heavy), ``trackers`` (which trackers, configured how), ``logger`` (RunLogger) and ``tables``.
"""
