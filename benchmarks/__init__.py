"""Benchmarks that print figures (never timed unit tests): estimator speed, the WebShop server at
scale, ALFWorld latency, one training iteration's time split. Run via ``python -m benchmarks NAME``.
"""
