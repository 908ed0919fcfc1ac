"""Where a key path (`("finetune", "optim", "lr")`) leads in a recipe's schema: for errors that name what a section
takes."""

import types
import typing

from pydantic import BaseModel
from pydantic.fields import FieldInfo


def _section(annotation) -> tuple[type[BaseModel] | None, bool]:
    """The section class an annotation holds (`X`, `X | None`, `dict[str, X]`), and whether it maps names to it."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is dict:
        return _section(args[1])[0], True
    if origin in (typing.Union, types.UnionType):
        return next(((found, named) for arg in args for found, named in [_section(arg)] if found), (None, False))
    return None, False


def section_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The section class `loc` names inside `model` (a name in a mapping of named sections counts as one part);
    None where `loc` leads to no section."""
    parts = list(loc)
    while parts:
        field = model.model_fields.get(str(parts.pop(0)))
        if field is None:
            return None
        model, named = _section(field.annotation)
        if model is None or (named and not parts):
            return None
        if named:
            parts.pop(0)
    return model


def field_at(model: type[BaseModel], loc: tuple) -> FieldInfo | None:
    """The field `loc` ends at, None where there is none."""
    section = section_at(model, loc[:-1]) if loc else None
    return section.model_fields.get(str(loc[-1])) if section else None


def names_sections(model: type[BaseModel], loc: tuple) -> bool:
    """Whether `loc` leads to a mapping of named sections (`("distill", "students")`, `("export", "bundles")`)."""
    field = field_at(model, loc)
    found, named = _section(field.annotation) if field else (None, False)
    return found is not None and named
