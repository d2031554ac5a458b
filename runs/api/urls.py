"""The runs API; both spellings of every path (scheduler_project/urlpaths.py)."""

from runs.api import views
from scheduler_project.urlpaths import both

KEY = "runs/<str:job_id>/<str:scheduled_at>"


urlpatterns = [
    *both("runs/", views.RunListView, "runs-list"),
    *both("dead-letter/", views.DeadLetterListView, "dead-letter-list"),
    *both(f"{KEY}/", views.RunDetailView, "runs-detail"),
    *both(f"{KEY}/replay", views.RunReplayView, "runs-replay"),
    *both(f"{KEY}/cancel", views.RunCancelView, "runs-cancel"),
]
