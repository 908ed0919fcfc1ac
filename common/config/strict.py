"""The base of every recipe section: unknown keys fail at load, values are frozen, and a setting added later is
hashed only once a recipe sets it."""

import types
import typing
from typing import Annotated, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializationInfo,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_serializer,
)

NAME_RULE = "letters, digits, `_` and `-`, starting with a letter or digit"
# A student's, a bundle's or a cascade's name: it names a folder (`bundle-<name>/`) and is a part of a dotted key
# (`export.bundles.<name>`), so it holds no `/` and no `.`
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")]
HASHING = {"hashing": True}  # the serialization context of a stage's hash (`Recipe.settings`)
RUN_NAME_RULE = "letters, digits, `.`, `_` and `-`, starting with a letter or digit"
# A recipe's name names its run folder alone (`runs/<name>/`, as a recipe file `sst2.v2.yaml` gives): no `/`, and no
# `.` or `..` that would put the run in the runs folder itself or above it
RunName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


def _takes_a_number(annotation) -> bool:
    """Whether a field of `annotation` takes a number and no boolean: `int`, `float`, or either or None, constrained
    or not (`PositiveInt`)."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    args = set(typing.get_args(annotation)) if union else {annotation}
    return bool({int, float} & args) and bool not in args


def _gives_a_boolean_for_a_number(value, annotation) -> bool:
    """Whether `value` holds a boolean where `annotation` takes a number (in a list, or a mapping's values, too)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and isinstance(value, list):
        return any(_gives_a_boolean_for_a_number(item, args[0]) for item in value)
    if origin is dict and isinstance(value, dict):
        return any(_gives_a_boolean_for_a_number(item, args[1]) for item in value.values())
    return isinstance(value, bool) and _takes_a_number(annotation)


class Strict(BaseModel):
    # no inf or nan: a count or a rate of .inf loads, then fails hours later in the stage that reads it
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    # Settings added after runs of this version existed: left out of the dump (so of every stage's hash) while at
    # their default, so that a new setting nobody sets keeps those runs' artifacts current.
    hashed_when_set: ClassVar[frozenset[str]] = frozenset()
    # Settings that change how work is done, not what it makes: dumped as their defaults under `HASHING`, so that
    # changing one neither makes an artifact stale nor discards a checkpoint, and a run at the default keeps its hash.
    hashed_as_default: ClassVar[frozenset[str]] = frozenset()

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, value, info: ValidationInfo):
        """Pydantic would read true as 1: a boolean given for a number is a mistake, not a number."""
        if _gives_a_boolean_for_a_number(value, cls.model_fields[info.field_name].annotation):
            raise ValueError(
                "a boolean where a number goes (YAML reads true, false, yes, no, on and off as booleans): give a number"
            )
        return value

    @model_serializer(mode="wrap")
    def _as_hashed(self, handler, info: SerializationInfo):
        dumped = handler(self)
        for name in self.hashed_when_set:
            if getattr(self, name) == type(self).model_fields[name].default:
                dumped.pop(name, None)
        if info.context == HASHING:
            for name in self.unread() & dumped.keys():
                dumped[name] = type(self).model_fields[name].default
        return dumped

    def unread(self) -> frozenset[str]:
        """The settings dumped as their defaults under `HASHING`: `hashed_as_default`, and in a section whose other
        settings leave some unread, those."""
        return self.hashed_as_default


class Overridden(dict):
    """A mapping that dotted overrides made where the recipe has none: only the keys they set. A mapping setting with
    a default or preset (a load profile's scenario weights) takes these keys into it, where a mapping the recipe
    spells out takes its place."""
