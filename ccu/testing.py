"""The old name of :mod:`ccu.density_check` (kept so older notebooks run).

``ccu.testing`` was the first name of the density contract checker (:func:`check_density`,
chapter *Try your own density model*); it read like a module of pytest helpers, so the checker
moved to :mod:`ccu.density_check`. Importing this module still works: it re-exports the
checker's public names and warns (``DeprecationWarning``) that it will go away. Write
``from ccu.density_check import check_density`` in new code.
"""

import warnings

from ccu.density_check import (
    GRID_CENTRES,
    GRID_RADII,
    BallFailure,
    DensityCheckError,
    DensityCheckReport,
    UnsoundDensityError,
    check_density,
)

__all__ = [
    "GRID_CENTRES",
    "GRID_RADII",
    "BallFailure",
    "DensityCheckError",
    "DensityCheckReport",
    "UnsoundDensityError",
    "check_density",
]

warnings.warn(
    "ccu.testing is the old name of ccu.density_check: import check_density (and the rest) "
    "from ccu.density_check; ccu.testing will be removed.",
    DeprecationWarning,
    stacklevel=2,
)
