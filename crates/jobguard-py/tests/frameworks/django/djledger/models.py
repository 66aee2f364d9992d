"""The tables ``frameworks/kills.py`` counts: ``ledger`` (one row per effect) and
``deliveries`` (one row per finished delivery)."""

from django.db import models


class Ledger(models.Model):
    job_key = models.TextField()
    pid = models.IntegerField()

    class Meta:
        db_table = "ledger"


class Delivery(models.Model):
    job_key = models.TextField()
    outcome = models.TextField()
    pid = models.IntegerField()

    class Meta:
        db_table = "deliveries"
