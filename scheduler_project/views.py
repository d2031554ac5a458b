"""The site root and the API's own root: what this server is and where its parts are."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

# The resources under /api/v1/, as a client discovers them from the API's root.
API_RESOURCES = {
    "jobs": "/api/v1/jobs/",
    "runs": "/api/v1/runs/",
    "dead_letter": "/api/v1/dead-letter/",
    "audit": "/api/v1/audit/",
    "tasks": "/api/v1/tasks/",
    "schedule_preview": "/api/v1/schedules/preview/",
    "forecast": "/api/v1/forecast/",
    "signing_secret_rotate": "/api/v1/signing-secret/rotate/",
    "health": "/api/v1/health/",
}
API_DOCS = {"schema": "/api/schema/", "docs": "/api/docs/", "redoc": "/api/redoc/"}


@require_GET
def landing(request: HttpRequest) -> HttpResponse:
    """`/`, also the admin's "View site": links to the console, API docs, metrics, health."""
    return render(request, "landing.html")


@require_GET
def api_root(request: HttpRequest) -> JsonResponse:
    """`/api/v1/` (what `make run` prints): the resources, absolute, and where the docs
    are. No token needed: it names paths, not data."""
    return JsonResponse(
        {
            "resources": {name: request.build_absolute_uri(path) for name, path in API_RESOURCES.items()},
            "documentation": {name: request.build_absolute_uri(path) for name, path in API_DOCS.items()},
            "authentication": "Authorization: Bearer <token> (manage.py create_tenant prints one)",
        }
    )


def api_not_found(request: HttpRequest, path: str = "") -> JsonResponse:
    """Any path under /api/ that names no resource: a JSON 404 like every API error, not
    Django's HTML page."""
    return JsonResponse(
        {"detail": f"Not found: no API resource at {request.path}. The resources are listed at /api/v1/."},
        status=404,
    )
