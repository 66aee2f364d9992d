"""Two databases: ``default`` on PostgreSQL (psycopg 3) and ``sqlite`` on a file, both with
``jobguard.django`` and the tests' ``djledger`` app migrated.

From the environment: ``JOBGUARD_DJANGO_DATABASE_URL`` (a worker's own PostgreSQL database;
else ``JOBGUARD_TEST_DATABASE_URL``), ``JOBGUARD_DJANGO_TEST_DB`` (the test database
pytest-django creates), ``JOBGUARD_DJANGO_SQLITE`` and ``JOBGUARD_DJANGO_SQLITE_TEST`` (files),
``JOBGUARD_TEST_BROKER`` and ``JOBGUARD_TEST_QUEUE`` (Celery).
"""

import os
import tempfile
import urllib.parse

_URL = urllib.parse.urlsplit(
    os.environ.get("JOBGUARD_DJANGO_DATABASE_URL")
    or os.environ.get("JOBGUARD_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
)
_TMP = tempfile.gettempdir()

SECRET_KEY = "jobguard-django-tests"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["testserver", "localhost"]
ROOT_URLCONF = "djproject.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "jobguard.django",
    "djledger",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _URL.path.lstrip("/") or "postgres",
        "USER": _URL.username or "postgres",
        "PASSWORD": _URL.password or "",
        "HOST": _URL.hostname or "127.0.0.1",
        "PORT": _URL.port or 5432,
        "TEST": {"NAME": os.environ.get("JOBGUARD_DJANGO_TEST_DB")},
    },
    "sqlite": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("JOBGUARD_DJANGO_SQLITE", os.path.join(_TMP, "jobguard-django.db")),
        # The write lock taken when the atomic block begins, as jobguard's guard wants on
        # SQLite; a writer waits up to 30 s for another's commit.
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30},
        "TEST": {"NAME": os.environ.get("JOBGUARD_DJANGO_SQLITE_TEST")},
    },
}

CELERY_BROKER_URL = os.environ.get("JOBGUARD_TEST_BROKER", "redis://127.0.0.1:6379/0")
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("JOBGUARD_TEST_QUEUE", "celery")
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Redis: a message unacked this long is handed out again; swept every second.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 2,
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
}
