"""JSON Schema of a task's kwargs, derived from its signature, and a checker for it.

A small explicit mapper, not pydantic (docs/decisions/0017-task-kwargs-schema.md): task kwargs arrive as
JSON, so the useful types are JSON's own. Mapped: int, float, str, bool, None,
list[T] / tuple[T, ...], dict[str, T], Optional[T] / T | None, Literal[...], Any.
Any other annotation (a class of the task's own) is left open (`{}`) rather than
guessed at. The checker understands exactly the subset this module emits, which is
also what `@register(schema=...)` may declare.

The executor calls `fn(context, **kwargs)`: a kwarg named like the context parameter
would be a TypeError on every run, so a schema that takes other kwargs reserves that
name (`"propertyNames": {"not": {"const": "context"}}`, `reserve_context`).
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_SCALARS: dict[type, dict] = {
    bool: {"type": "boolean"},
    int: {"type": "integer"},
    float: {"type": "number"},
    str: {"type": "string"},
    type(None): {"type": "null"},
}
_TYPE_WORDS = {
    "boolean": "true or false",
    "integer": "a whole number",
    "number": "a number",
    "string": "a string",
    "null": "null",
    "array": "a list",
    "object": "an object",
}


def kwargs_schema(fn: Callable) -> dict:
    """`{"type": "object", "properties", "required", "additionalProperties"}` of fn's kwargs.

    The first parameter is the TaskContext the executor passes; it is not a kwarg.
    """
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an unresolvable forward reference: fall back to "any value"
        hints = {}
    params = list(signature.parameters.values())[1:]
    properties: dict[str, dict] = {}
    required: list[str] = []
    open_ended = False
    for param in params:
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            open_ended = True
            continue
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
            continue  # kwargs cannot reach these
        prop = type_schema(hints.get(param.name, Any))
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
        elif _is_json(param.default):
            prop = {**prop, "default": param.default}
        properties[param.name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": open_ended}
    if required:
        schema["required"] = required
    return schema


def context_parameter(fn: Callable) -> str | None:
    """The name the executor's TaskContext binds to (the first parameter), if a kwarg
    could also be passed under it."""
    params = list(inspect.signature(fn).parameters.values())
    if params and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
        return params[0].name
    return None


def reserve_context(schema: dict, fn: Callable) -> dict:
    """`schema` with the context parameter's name refused as a kwarg, where it takes
    other kwargs; ValueError if it declares that name as one."""
    name = context_parameter(fn)
    if name is None or schema.get("additionalProperties", True) is False:
        return schema
    if name in (schema.get("properties") or {}):
        raise ValueError(f"the kwargs schema declares {name!r}, which the task receives its run context as")
    return {**schema, "propertyNames": {"not": {"const": name}}}


def type_schema(hint: Any) -> dict:
    """JSON Schema of one annotation; `{}` (any JSON value) for what JSON cannot express."""
    if hint is Any or hint is inspect.Parameter.empty:
        return {}
    if hint in _SCALARS:
        return dict(_SCALARS[hint])
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [type_schema(a) for a in args]
        if any(o == {} for o in options):
            return {}
        return options[0] if len(options) == 1 else {"anyOf": options}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if hint in (list, tuple) or origin in (list, tuple, Sequence):
        schema: dict[str, Any] = {"type": "array"}
        homogeneous = origin is not tuple or (len(args) == 2 and args[1] is Ellipsis)
        if args and homogeneous and (item := type_schema(args[0])):
            schema["items"] = item
        return schema
    if hint is dict or origin in (dict, Mapping):
        schema = {"type": "object"}
        if len(args) == 2 and type_schema(args[1]):
            schema["additionalProperties"] = type_schema(args[1])
        return schema
    return {}


def errors(schema: Mapping, kwargs: Mapping, *, task: str, path: str = "target.kwargs") -> list[str]:
    """Every problem of `kwargs` against a kwargs schema, each naming its path."""
    problems: list[str] = []
    properties = schema.get("properties") or {}
    for name in schema.get("required") or []:
        if name not in kwargs:
            problems.append(f"{path}.{name}: required by task {task!r}.")
    extra = schema.get("additionalProperties", True)
    reserved = ((schema.get("propertyNames") or {}).get("not") or {}).get("const")
    for key, value in kwargs.items():
        if key == reserved:
            problems.append(
                f"{path}.{key}: reserved: task {task!r} receives its run context as {key!r}, "
                "so no kwarg may have that name."
            )
        elif key in properties:
            problems.extend(value_errors(properties[key], value, f"{path}.{key}"))
        elif extra is False:
            takes = ", ".join(properties) or "no kwargs"
            problems.append(f"{path}.{key}: task {task!r} has no such parameter (it takes {takes}).")
        elif isinstance(extra, Mapping):
            problems.extend(value_errors(extra, value, f"{path}.{key}"))
    return problems


def value_errors(schema: Mapping, value: Any, path: str) -> list[str]:
    if not schema:
        return []
    if "anyOf" in schema:
        results = [value_errors(option, value, path) for option in schema["anyOf"]]
        if not all(results):
            return []
        # The value has the right shape for one option (a list for list[str] | None):
        # its inner problems (`tags[1]`) say more than "must be a list or null".
        options = zip(schema["anyOf"], results, strict=True)
        shaped = [r for o, r in options if "type" in o and _is_type(o["type"], value)]
        if len(shaped) == 1:
            return shaped[0]
        return [f"{path}: must be {' or '.join(_words(o) for o in schema['anyOf'])} (got {_shown(value)})."]
    if "enum" in schema:
        if any(value == choice and type(value) is type(choice) for choice in schema["enum"]):
            return []
        return [f"{path}: must be one of {', '.join(map(_shown, schema['enum']))} (got {_shown(value)})."]
    kind = schema.get("type")
    if kind is not None and not _is_type(kind, value):
        return [f"{path}: must be {_TYPE_WORDS.get(kind, kind)} (got {_shown(value)})."]
    if kind == "array" and "items" in schema:
        item_schema = schema["items"]
        return [p for i, item in enumerate(value) for p in value_errors(item_schema, item, f"{path}[{i}]")]
    if kind == "object" and isinstance(schema.get("additionalProperties"), Mapping):
        item_schema = schema["additionalProperties"]
        return [p for k, item in value.items() for p in value_errors(item_schema, item, f"{path}.{k}")]
    return []


def _is_type(kind: str, value: Any) -> bool:
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "null":
        return value is None
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    return True


def _words(schema: Mapping) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(map(_shown, schema["enum"]))
    return _TYPE_WORDS.get(schema.get("type", ""), "any value")


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
