"""The base of every typed config slice: a frozen dataclass whose fields are flag names.

The driver parses the flags once (relax/utils/arguments.py, relax/utils/validation.py) and builds each
component's slice with ``SliceClass.from_args(args)``; the component then sees only the fields it
declares, so its dependencies on the 300-odd flags are the field list. Defaults live in the flag
schema (relax/utils/flag_table.py), not here: every field is read strictly, and a field that the
namespace lacks is a programming error named at once. A slice whose component calls a user hook that
the seeds give the whole namespace (``reward_func(args, sample)``, ``GenerateState(args)``) declares
``args: Any = field(default=None, compare=False, repr=False)`` and gets it filled; no other code reads it.
A slice that bundles another (the trainer's config holds the algorithm's) declares the field with
``sub_slice(OtherConfig)``; ``from_args`` builds it from the same namespace.
"""

from __future__ import annotations

import dataclasses
from argparse import Namespace
from typing import Any, Self


@dataclasses.dataclass(frozen=True)
class FlagSlice:
    """Subclass as ``@dataclass(frozen=True) class XConfig(FlagSlice): flag_name: type ...``."""

    @classmethod
    def from_args(cls, args: Namespace) -> Self:
        nested = {f.name: f.metadata["slice"] for f in dataclasses.fields(cls) if "slice" in f.metadata}
        names = [f.name for f in dataclasses.fields(cls) if f.name != "args" and f.name not in nested]
        missing = [n for n in names if not hasattr(args, n)]
        if missing:
            raise ValueError(
                f"{cls.__name__}: args lacks {', '.join(missing)}: parse flags with relax.utils.arguments first"
            )
        values = {n: getattr(args, n) for n in names}
        for f in dataclasses.fields(cls):  # store_true flags whose schema default is "-" arrive as None
            if f.name in values and f.type in ("bool", bool):
                values[f.name] = bool(values[f.name])
        values.update({name: slice_cls.from_args(args) for name, slice_cls in nested.items()})
        if "args" in {f.name for f in dataclasses.fields(cls)}:
            values["args"] = args
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Checks of this slice's own fields; the flag-level checks already ran in relax/utils/validation.py."""

    def replace(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)


def sub_slice(slice_cls: type[FlagSlice]) -> Any:
    """A field holding another slice, built by ``from_args`` from the same flags."""
    return dataclasses.field(metadata={"slice": slice_cls})
