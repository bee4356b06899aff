"""The optional parts of Silbo (the extras of ``pip install silbo[...]``) and their check.

The core install is the broker. ``[spark]`` adds the Spark matcher (``silbo replay``, the
Spark offload, ``silbo bench spark``); ``[archive]`` the archive's Parquet files (``silbo
run archiver``, ``silbo archive status``); ``[bench]`` the plots of ``silbo bench``; ``[test]`` the
test and lint tools. Code that needs an extra imports it where it is used, after
:func:`require`, so ``import broker`` and ``silbo run`` work without any extra.
"""

from __future__ import annotations

from importlib.util import find_spec

from broker.errors import MissingExtra

__all__ = ["EXTRAS", "require"]

# extra -> the modules it provides that Silbo imports
EXTRAS: dict[str, tuple[str, ...]] = {
    "spark": ("pyspark", "pandas", "pyarrow"),
    "archive": ("pyarrow",),
    "bench": ("matplotlib",),
}


def require(extra: str, what: str) -> None:
    """Raise :class:`MissingExtra` unless every module of ``extra`` can be imported.

    ``what``: the feature that needs it, for the message (``"silbo replay"``)."""
    missing = [module for module in EXTRAS[extra] if find_spec(module) is None]
    if missing:
        raise MissingExtra(
            f"{what} needs {', '.join(missing)}: install silbo[{extra}] "
            f"(pip install 'silbo[{extra}]')"
        )
