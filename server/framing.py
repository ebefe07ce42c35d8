"""Deprecated: ``lamina.server.framing`` is now ``lamina.wire.framing`` (frames and strict CBOR)
and ``lamina.wire.splicing`` (frames built around stored records), with the CBOR head encoder
``lamina.engine.records.cbor_head``; this alias goes in the next release."""

import warnings

from lamina.engine.records import cbor_head as encode_head  # noqa: F401
from lamina.wire.framing import *  # noqa: F401,F403
from lamina.wire.framing import __all__ as _framing_names
from lamina.wire.splicing import *  # noqa: F401,F403
from lamina.wire.splicing import __all__ as _splicing_names

__all__ = [*_framing_names, *_splicing_names, "encode_head"]

warnings.warn("lamina.server.framing is deprecated: import from lamina.wire.framing and "
              "lamina.wire.splicing", DeprecationWarning, stacklevel=2)
