"""How deep JSON a client sends may nest.

Code that walks a value recursively (the JSON decoder and encoder, dict comparison,
the audit log's copy of a change) runs out of Python's stack somewhere between a few
hundred and a thousand levels, depending on how deep the stack already is: a 500, at
a depth that varies with the caller. Two fixed bounds, far beyond any real payload and
far below that, make the answer a 400 that does not depend on the caller:

* MAX_DOCUMENT_NESTING: a whole JSON document a client posts (an API request body,
  a JSON string in a form-encoded API field, the admin's target text), refused before
  anything reads it (jobs/api/parsers.py, jobs/api/fields.py, jobs/admin/forms.py);
* MAX_VALUE_NESTING: a target's `body` and a task's `kwargs`, which are stored,
  copied into every run and sent on every call (jobs/rules/target.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

MAX_DOCUMENT_NESTING = 64
MAX_VALUE_NESTING = 32


class TooDeep(ValueError):
    """A JSON document nested deeper than MAX_DOCUMENT_NESTING."""


def too_deep_message(limit: int = MAX_DOCUMENT_NESTING) -> str:
    return f"nested more than {limit} levels deep; the limit is {limit} levels."


def nesting(value: Any, *, limit: int) -> int:
    """Levels of objects and lists in `value` (a scalar is 0, `{"a": [1]}` is 2), counted
    only until it exceeds `limit`. Iterative: the values it must measure are the ones
    too deep to recurse into."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > limit:
            break
        stack.extend((child, level + 1) for child in children if isinstance(child, dict | list | tuple))
    return deepest


def too_deep_fields(document: dict) -> dict[str, list[str]]:
    """The top-level fields of an object deeper than MAX_DOCUMENT_NESTING that make it so,
    each with the message (the object itself is the first level)."""
    inner = MAX_DOCUMENT_NESTING - 1
    message = too_deep_message()
    return {str(k): [message] for k, v in document.items() if nesting(v, limit=inner) > inner}


def check_document(document: Any) -> None:
    """Raise TooDeep if `document` nests deeper than MAX_DOCUMENT_NESTING."""
    if nesting(document, limit=MAX_DOCUMENT_NESTING) > MAX_DOCUMENT_NESTING:
        raise TooDeep(too_deep_message())


@contextmanager
def decoding() -> Iterator[None]:
    """Around a JSON decoder: a document too deep for the decoder itself is TooDeep too."""
    try:
        yield
    except RecursionError:
        raise TooDeep(too_deep_message()) from None


def loads(text: str | bytes) -> Any:
    """json.loads within the bound: TooDeep, or ValueError for text that is not JSON."""
    with decoding():
        document = json.loads(text)
    check_document(document)
    return document
