from runs.metrics import metrics_view
from scheduler_project.urlpaths import both

urlpatterns = both("metrics", metrics_view, "metrics")
