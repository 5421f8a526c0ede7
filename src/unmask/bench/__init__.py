"""Measurement: the roofline cost model (and, later, the quality-speed benchmark it predicts)."""
