"""The read-only admin page of the guard rows, through Django's test client: it lists the keys
with their first applied time and stored result, on PostgreSQL (the admin site) and on SQLite
(a second admin site whose ModelAdmin reads the ``sqlite`` alias); adding, changing and
deleting are refused."""

from __future__ import annotations

import uuid

import pytest
from django.db import transaction
from django.utils import formats, timezone

import jobguard
import jobguard.django
from jobguard.django.models import GuardRow

PAGES = {"default": "/admin/jobguard/guardrow/", "sqlite": "/sqlite-admin/jobguard/guardrow/"}


def apply(using: str, order: str, result) -> str:
    key = jobguard.key("credit", order)
    with transaction.atomic(using=using):
        with jobguard.django.guard(key, using=using) as g:
            assert g.applied
            g.set_result(result)
    return key


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
@pytest.mark.parametrize("using", ["default", "sqlite"])
def test_the_admin_page_lists_keys_with_first_applied_time_and_result(admin_client, using):
    order = uuid.uuid4().hex[:12]
    key = apply(using, order, {"credited": 500})
    other = apply(using, order + "-b", None)
    row = GuardRow.objects.using(using).get(job_key=key)
    page = admin_client.get(PAGES[using])
    assert page.status_code == 200
    html = page.content.decode()
    assert key in html and other in html
    assert "credited" in html and "500" in html
    # As the admin shows a datetime: in the current time zone, in the locale's format.
    assert formats.localize(timezone.template_localtime(row.applied_at)) in html
    # Searched by the whole key, which is the primary key.
    found = admin_client.get(PAGES[using], {"q": key}).content.decode()
    assert key in found and other not in found
    assert admin_client.get(PAGES[using] + "add/").status_code == 403


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_guard_row_can_be_viewed_but_not_changed_or_deleted(admin_client):
    from django.contrib.admin.utils import quote

    key = apply("default", uuid.uuid4().hex[:12], {"credited": 7})
    url = f"{PAGES['default']}{quote(key)}/change/"
    view = admin_client.get(url)
    assert view.status_code == 200
    html = view.content.decode()
    assert key in html and "credited" in html
    assert 'name="_save"' not in html  # view only: no save button
    posted = admin_client.post(url, {"kind": "changed"})
    assert posted.status_code == 403
    assert admin_client.post(f"{PAGES['default']}{quote(key)}/delete/", {"post": "yes"}).status_code == 403
    assert GuardRow.objects.get(job_key=key).kind == "credit"
