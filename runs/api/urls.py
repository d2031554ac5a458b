"""Every path answers with and without the trailing slash (DESIGN section 4). The named
spelling is the one `reverse` hands out and the OpenAPI schema documents; the other
is an alias left out of the schema so each operation appears once."""

from django.urls import path
from drf_spectacular.utils import extend_schema

from runs.api import views

KEY = "runs/<str:job_id>/<str:scheduled_at>"


def both(route: str, view_class, name: str) -> list:
    alias_route = route.removesuffix("/") if route.endswith("/") else route + "/"
    alias_class = extend_schema(exclude=True)(type(f"{view_class.__name__}Alias", (view_class,), {}))
    return [path(route, view_class.as_view(), name=name), path(alias_route, alias_class.as_view())]


urlpatterns = [
    *both("runs/", views.RunListView, "runs-list"),
    *both("dead-letter/", views.DeadLetterListView, "dead-letter-list"),
    *both(f"{KEY}/", views.RunDetailView, "runs-detail"),
    *both(f"{KEY}/replay", views.RunReplayView, "runs-replay"),
    *both(f"{KEY}/cancel", views.RunCancelView, "runs-cancel"),
]
