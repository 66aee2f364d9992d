from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Ledger",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("job_key", models.TextField()),
                ("pid", models.IntegerField()),
            ],
            options={"db_table": "ledger"},
        ),
        migrations.CreateModel(
            name="Delivery",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("job_key", models.TextField()),
                ("outcome", models.TextField()),
                ("pid", models.IntegerField()),
            ],
            options={"db_table": "deliveries"},
        ),
    ]
