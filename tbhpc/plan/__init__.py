"""Sizing before booking: the scaling model (model.py) and its calibration on measured runs (calibrate.py)."""
