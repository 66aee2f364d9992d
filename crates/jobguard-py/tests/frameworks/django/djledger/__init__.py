"""The tests' own app: a ledger the guarded effects write, the deliveries they record, and the
guarded Celery task."""
