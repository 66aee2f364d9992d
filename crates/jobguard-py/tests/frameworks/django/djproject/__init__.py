"""The Django project jobguard.django's tests run: settings, admin URLs and a Celery app."""
