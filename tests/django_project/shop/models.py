from django.db import models


class Order(models.Model):
    item = models.TextField()
    email = models.TextField(default="")  # docs/django.md's snippets create orders by email

    class Meta:
        app_label = "shop"
