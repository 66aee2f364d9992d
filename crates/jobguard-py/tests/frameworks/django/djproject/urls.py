"""The admin, and a second admin site reading the guard rows of the ``sqlite`` database."""

from django.contrib import admin
from django.urls import path

from jobguard.django.admin import GuardRowAdmin
from jobguard.django.models import GuardRow


class SqliteGuardRowAdmin(GuardRowAdmin):
    def get_queryset(self, request):
        return super().get_queryset(request).using("sqlite")


sqlite_site = admin.AdminSite(name="sqlite_admin")
sqlite_site.register(GuardRow, SqliteGuardRowAdmin)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("sqlite-admin/", sqlite_site.urls),
]
