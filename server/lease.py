"""Deprecated: ``lamina.server.lease`` is now ``lamina.client.lease``;
this alias goes in the next release."""

import warnings

from lamina.client.lease import *  # noqa: F401,F403
from lamina.client.lease import __all__  # noqa: F401

warnings.warn("lamina.server.lease is deprecated: import from lamina.client.lease",
              DeprecationWarning,
              stacklevel=2)
