"""A short path proved against the general one: the same scenario played twice, once with the
short path and once with it declining every call (so the general path does all the work)."""

from __future__ import annotations

from typing import Any, Callable

import pytest


def both_paths(module: Any, name: str, fast: Callable[[], Any], general: Callable[[], Any],
               took: Callable[[Any], bool] = lambda result: result is not None
               ) -> tuple[Any, Any, int]:
    """``fast()`` with ``module.name`` (the short path) counted, then ``general()`` with it
    answering None, as it does when it declines -> (fast's result, general's, the calls the
    short path took, as ``took`` tells them from its result)."""
    taken = 0
    short = getattr(module, name)

    def counting(*args: Any) -> Any:
        nonlocal taken
        result = short(*args)
        taken += took(result)
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, name, counting)
        first = fast()
        patch.setattr(module, name, lambda *args: None)
        second = general()
    return first, second, taken
