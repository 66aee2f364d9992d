"""pytest-django on the tests' project (``djproject``): a PostgreSQL test database of this
run's own and a SQLite file, both migrated by pytest-django before the first test."""

from __future__ import annotations

import os
import tempfile
import uuid

# Before pytest-django reads the settings, which take these from the environment.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djproject.settings")
os.environ["JOBGUARD_DJANGO_TEST_DB"] = "jgdj_" + uuid.uuid4().hex[:12]
os.environ["JOBGUARD_DJANGO_SQLITE_TEST"] = os.path.join(
    tempfile.mkdtemp(prefix="jobguard-django-"), "test.db"
)

import django  # noqa: E402

# The test modules import models at collection, before pytest-django's session fixtures.
django.setup()
