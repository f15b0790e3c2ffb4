"""Test-only helpers of the suite: the patience bound (``patience``) and the loop-reference estimators (``reference``).

Imported as ``progpo_tests`` (pyproject ``pythonpath`` adds ``tests/support``): a site-packages ``tests``
package can shadow the test folder as an import name.
"""
