"""Deprecated: ``lamina.server.operations`` is now ``lamina.client.operations``;
this alias goes in the next release."""

import warnings

from lamina.client.operations import *  # noqa: F401,F403
from lamina.client.operations import __all__  # noqa: F401

warnings.warn("lamina.server.operations is deprecated: import from lamina.client.operations",
              DeprecationWarning,
              stacklevel=2)
