"""Deprecated: ``lamina.server.client`` is now ``lamina.client``;
this alias goes in the next release."""

import warnings

from lamina.client import *  # noqa: F401,F403
from lamina.client import __all__  # noqa: F401

warnings.warn("lamina.server.client is deprecated: import from lamina.client", DeprecationWarning,
              stacklevel=2)
