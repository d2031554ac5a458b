"""The site root: what this server is and where its parts are."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET


@require_GET
def landing(request: HttpRequest) -> HttpResponse:
    """`/`, also the admin's "View site": links to the console, API docs, metrics, health."""
    return render(request, "landing.html")
