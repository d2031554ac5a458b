"""Every path answers with and without the trailing slash (docs/CONTRACT.md, "REST API").

`both()` is the one way to say it for a plain route: the named spelling is the one
`reverse` hands out and the OpenAPI schema documents; the other is an alias left out
of the schema, so each operation appears once. The job API keeps the regex form
`/?` because its DRF router knows no other (and its four sibling routes follow it so
that their schema paths and reversed links stay as published).
"""

from __future__ import annotations

from django.urls import path
from drf_spectacular.utils import extend_schema


def both(route: str, view, name: str) -> list:
    """`route` under `name`, plus its other spelling; `view` is an APIView class or a function."""
    alias_route = route.removesuffix("/") if route.endswith("/") else route + "/"
    if isinstance(view, type):
        alias_class = extend_schema(exclude=True)(type(f"{view.__name__}Alias", (view,), {}))
        return [path(route, view.as_view(), name=name), path(alias_route, alias_class.as_view())]
    return [path(route, view, name=name), path(alias_route, view)]
