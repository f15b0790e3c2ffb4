"""Advantages do not depend on ``PYTHONHASHSEED``: two processes with different string-hash seeds give
bitwise-equal advantages for every estimator and preset.

Found in a lab rerun (2026-12-07): two of a block's 220 sweep runs, both CRBC's, diverged from the block's
saved runs after 42 and 83 iterations. ``factorize`` numbered anchor states in string-hash order, which changes
with the process's hash seed, and the closure's edge sums ran in that order; float rounding then differed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from progpo.advantages import PRESETS
from progpo.advantages._prep import factorize

REPO = Path(__file__).resolve().parents[2]

# every estimator at its defaults, every preset (on its own estimator; ProGPO's on progpo), ProGPO's
# closure potentials, and the non-default keys a researcher offers the baselines
_SCRIPT = r"""
import hashlib
import numpy as np
from progpo.advantages import ESTIMATORS, PRESETS, compute_advantages, config_from_preset
from progpo.advantages.config import PRESET_ESTIMATOR
from benchmarks.synthetic_batches import HashEncoder, alfworld_like_batch, random_batch

configs = [(None, {"estimator": name}) for name in sorted(ESTIMATORS)]
configs += [(p, {} if p in PRESET_ESTIMATOR else {"estimator": "progpo"}) for p in PRESETS]
configs += [(None, {"estimator": "progpo", "potential_target": "closure"}),
            (None, {"estimator": "progpo", "prefix_mode": "history", "depths": 2}),
            (None, {"estimator": "gigpo", "state_key": "obs_inventory"})]
batches = [random_batch(s, max_traj=8, max_len=12) for s in range(12)] + [alfworld_like_batch(4, 8, 30, seed=0)]
enc = HashEncoder()
for preset, kw in configs:
    cfg = config_from_preset(preset, **kw)
    h = hashlib.sha256()
    for b in batches:
        h.update(np.ascontiguousarray(compute_advantages(b, cfg, enc).advantages).tobytes())
    print(preset, sorted(kw.items()), h.hexdigest())
"""


def _digests(hash_seed: str) -> list[str]:
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": path}
    out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, cwd=REPO, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_advantages_equal_under_two_hash_seeds():
    a, b = _digests("1"), _digests("2")
    assert len(a) >= len(PRESETS) + 3
    assert a == b


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(["", "a", "b", "drawer 1", "é", "x" * 50, "\x00"]), st.text()),
                min_size=1, max_size=40))
def test_factorize_numbers_values_by_first_occurrence(values):
    codes, k = factorize(np.array(values, dtype=object))
    seen: dict[str, int] = {}
    expected = [seen.setdefault(v, len(seen)) for v in values]
    assert codes.tolist() == expected and k == len(seen)
