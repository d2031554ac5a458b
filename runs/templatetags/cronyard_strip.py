"""`{% status_strip %}`: the status strip (runs/admin/health_strip.py) on the admin home
(templates/admin/index.html) and the dashboard, from the page's request."""

from __future__ import annotations

from django import template
from django.contrib import admin
from django.utils import timezone

from runs.admin.health_strip import strip

register = template.Library()


@register.inclusion_tag("admin/status_strip.html", takes_context=True)
def status_strip(context) -> dict:
    request = context["request"]
    # Other query parameters of the page (the dashboard's refresh, its forecast tenant)
    # ride along when the strip's tenant menu is submitted.
    kept = [(k, v) for k, v in request.GET.items() if k != "tenant"]
    return {"strip": strip(request, admin_site=admin.site, now=timezone.now()), "kept_params": kept}
