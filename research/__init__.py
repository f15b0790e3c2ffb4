"""The credit-assignment lab: synthetic task families with exact truth (dynamic programming), the exact
oracle, a log-linear learner, censored learning statistics and the generated blocks of docs/fidelity.md.

Run through ``python -m research fidelity|learning``. The task families live in ``progpo.envs.synthetic``.
"""
