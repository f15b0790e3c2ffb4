"""Synthetic text task families with exact truth: ALFWorld-like rooms and WebShop-like search and select.

``families`` (task generators, their configs and the lab learner's shared features), ``alfworld_like`` and
``webshop_like`` (the tasks: finite text MDPs with a fixed behaviour policy), ``mdp`` (the transition
outcome and the MDP protocol the exact oracle of ``progpo.lab.oracle`` solves) and ``behaviour`` (the
behaviour policy shared by the families). The credit-assignment lab (``progpo.lab``) imports them from here.
"""
