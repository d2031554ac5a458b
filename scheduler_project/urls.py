from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from scheduler_project.urlpaths import both
from scheduler_project.views import api_not_found, api_root, landing

admin.site.site_header = "Cronyard"
admin.site.site_title = "Cronyard console"
admin.site.index_title = "Jobs, runs and the dead-letter queue"
admin.site.site_url = "/"  # "View site": the landing page below
# The app list beside every page took 290 px: at 1280 px the runs list, its filters and
# the sidebar did not fit. Breadcrumbs and the home page still lead everywhere.
admin.site.enable_nav_sidebar = False

urlpatterns = [
    path("", landing, name="landing"),
    path("admin/", admin.site.urls),
    *both("api/schema/", SpectacularAPIView.as_view(), "schema"),
    *both("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), "docs"),
    *both("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), "redoc"),
    *both("api/v1/", api_root, "api-root"),
    path("api/v1/", include("jobs.api.urls")),
    path("api/v1/", include("runs.api.urls")),
    path("", include("runs.metrics_urls")),
    # Last: whatever else starts with api/ answers a JSON 404.
    re_path(r"^api/(?P<path>.*)$", api_not_found),
]
