"""pytest-django on the tests' project (``djproject``): a PostgreSQL test database of this
run's own and a SQLite file, both migrated by pytest-django before the first test."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid

# Before pytest-django reads the settings, which take these from the environment.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djproject.settings")
os.environ["JOBGUARD_DJANGO_TEST_DB"] = "jgdj_" + uuid.uuid4().hex[:12]
_SQLITE_DIR = tempfile.mkdtemp(prefix="jobguard-django-")
atexit.register(shutil.rmtree, _SQLITE_DIR, ignore_errors=True)
os.environ["JOBGUARD_DJANGO_SQLITE_TEST"] = os.path.join(_SQLITE_DIR, "test.db")

import django  # noqa: E402

# The test modules import models at collection, before pytest-django's session fixtures.
django.setup()
