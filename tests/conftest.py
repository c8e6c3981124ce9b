"""Suite-wide setup: the hypothesis profile (``HYPOTHESIS_PROFILE``, see ``laws.py``)."""

import laws  # noqa: F401  (registers and loads the profile)
