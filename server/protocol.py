"""Deprecated: ``lamina.server.protocol`` is now ``lamina.wire.protocol``;
this alias goes in the next release."""

import warnings

from lamina.wire.protocol import *  # noqa: F401,F403
from lamina.wire.protocol import __all__  # noqa: F401

warnings.warn("lamina.server.protocol is deprecated: import from lamina.wire.protocol",
              DeprecationWarning,
              stacklevel=2)
