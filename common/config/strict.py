"""The base of every recipe section: unknown keys fail at load, values are frozen, and a setting added later is
hashed only once a recipe sets it."""

from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, StringConstraints, model_serializer

NAME_RULE = "letters, digits, `_` and `-`, starting with a letter or digit"
# A recipe's, a student's, a bundle's or a cascade's name: it names a folder (`runs/<name>/`, `bundle-<name>/`) and is a
# part of a dotted key (`export.bundles.<name>`), so it holds no `/` and no `.`
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # Settings added after runs of this version existed: left out of the dump (so of every stage's hash) while at
    # their default, so that a new setting nobody sets keeps those runs' artifacts current.
    hashed_when_set: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _leave_out_unset_later_settings(self, handler):
        dumped = handler(self)
        for name in self.hashed_when_set:
            if getattr(self, name) == type(self).model_fields[name].default:
                dumped.pop(name, None)
        return dumped


class Overridden(dict):
    """A mapping that dotted overrides made where the recipe has none: only the keys they set. A mapping setting with
    a default or preset (a load profile's scenario weights) takes these keys into it, where a mapping the recipe
    spells out takes its place."""
