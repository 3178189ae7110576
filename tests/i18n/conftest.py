"""The zh fixture: Chinese for one test, English again after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tracer.i18n import set_language


@pytest.fixture
def zh() -> Iterator[None]:
    set_language("zh")
    try:
        yield
    finally:
        set_language("en")
