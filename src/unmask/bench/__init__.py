"""Measurement: the quality-speed benchmark (`unmask bench`: grid, runner, statistics, report), the
roofline cost model that predicts it, and the GSM8K, HumanEval and lm-eval harnesses."""
