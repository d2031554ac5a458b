from django.urls import path

from runs.metrics import metrics_view

urlpatterns = [
    path("metrics", metrics_view, name="metrics"),
    path("metrics/", metrics_view),
]
