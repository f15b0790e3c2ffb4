"""Synthetic text environments with exact truth: the ALFWorld-like and WebShop-like task families.

``families`` (task generators, their configs and the lab learner's shared features), ``alfworld_like`` and
``webshop_like`` (the tasks: finite text MDPs with a fixed behaviour policy), ``mdp`` (the transition
outcome and the MDP protocol the exact oracle of ``research.oracle`` solves), ``behaviour`` (the
behaviour policy shared by the families) and ``env`` (each family as a ``TextEnv``, registered in
``progpo.envs`` as ``alfworld_like`` and ``webshop_like``, with its expert). The credit-assignment lab
(``research``) imports the families from here.
"""
