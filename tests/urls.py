from django.contrib import admin
from django.urls import include, path

from scheduler_app import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/scheduler/", include("scheduler_app.api.urls")),
    path("metrics/", metrics.view),
]
