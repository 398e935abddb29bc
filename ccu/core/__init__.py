"""The paper's mathematics: the metric (eq. (12)), densities that bound themselves over a ball
and their checker, the CCU model (eq. (7)), Theorem 1 and Corollary 1, the losses (eq. (6)),
l_p conversions, the networks, the attack and the OOD metrics.

Nothing here imports the rest of ``ccu`` (``tests/test_import_graph.py`` holds it to that):
the certificates depend on this package alone.
"""
