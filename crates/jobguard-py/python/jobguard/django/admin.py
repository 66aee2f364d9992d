"""The guard rows in Django's admin, read-only: keys, kinds, when each was first applied and
the result its first delivery stored. No add, change or delete: a guard row is the record
that a job took effect, written in the job's transaction; deleting one lets the next delivery
of its job apply again (prune old rows with ``jobguard prune``, docs/retention.md)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from .models import GuardRow


@admin.register(GuardRow)
class GuardRowAdmin(admin.ModelAdmin):
    list_display = ("job_key", "kind", "applied_at", "result")
    search_fields = ("job_key",)
    search_help_text = "a job key, exactly (credit:order-8812)"
    fields = ("job_key", "kind", "applied_at", "result", "fingerprint_hex")
    readonly_fields = fields
    show_full_result_count = False  # a count(*) of a large guard table on every page

    @admin.display(description="fingerprint")
    def fingerprint_hex(self, row: GuardRow) -> str:
        return "" if row.fingerprint is None else bytes(row.fingerprint).hex()

    def get_search_results(self, request: Any, queryset: Any, search_term: str) -> Any:
        # The whole key, by its primary key: a substring search would scan the table.
        term = search_term.strip()
        return (queryset.filter(job_key=term) if term else queryset), False

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False
