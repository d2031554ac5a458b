"""Every path works with and without a trailing slash (docs/CONTRACT.md, "REST API"); why
the regex form here and `both()` elsewhere: scheduler_project/urlpaths.py."""

from django.urls import re_path
from rest_framework.routers import SimpleRouter

from . import schema  # noqa: F401 - registers the OpenAPI description of the token auth
from .audit import AuditListView
from .forecast_views import ForecastView
from .signing_views import SigningSecretRotateView
from .task_views import TaskListView
from .views import HealthView, JobViewSet, SchedulePreviewView

router = SimpleRouter()
# The constructor only takes a bool (it maps True to "/"); the regex form is set afterwards.
router.trailing_slash = "/?"
router.register("jobs", JobViewSet, basename="job")

urlpatterns = [
    re_path(r"^health/?$", HealthView.as_view(), name="health"),
    re_path(r"^audit/?$", AuditListView.as_view(), name="audit-list"),
    re_path(r"^tasks/?$", TaskListView.as_view(), name="task-list"),
    re_path(r"^forecast/?$", ForecastView.as_view(), name="forecast"),
    re_path(r"^schedules/preview/?$", SchedulePreviewView.as_view(), name="schedule-preview"),
    re_path(r"^signing-secret/rotate/?$", SigningSecretRotateView.as_view(), name="signing-secret-rotate"),
    *router.urls,
]
