"""jobguard for Django: an installable app (``INSTALLED_APPS = [..., "jobguard.django"]``).

- ``python manage.py migrate`` creates the guard table (``processed_jobs``, with its claim
  functions on PostgreSQL) with the Rust core's statements for the alias's database, on
  PostgreSQL and SQLite (:mod:`jobguard.django.migrations`);
- ``with jobguard.django.guard(key, payload) as g:`` claims a key on Django's connection inside
  ``transaction.atomic()`` (:mod:`jobguard.django.guard`); ``@jobguard.django.guarded(key=...)``
  opens the atomic block and calls the function only when the delivery holds the key;
- :class:`jobguard.django.celery.DjangoTask`: a Celery task base that runs the task in
  ``transaction.atomic(using=...)`` with its guard row;
- a read-only admin page of the guard rows (:mod:`jobguard.django.admin`).

See docs/python.md, "Django".
"""

from __future__ import annotations

from .guard import guard, guarded

__all__ = ["guard", "guarded"]
