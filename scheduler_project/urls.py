from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from scheduler_project.views import landing

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
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="redoc"),
    path("api/v1/", include("jobs.api.urls")),
    path("api/v1/", include("runs.api.urls")),
    path("", include("runs.metrics_urls")),
]
