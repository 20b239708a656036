from django.db import models


class Order(models.Model):
    item = models.TextField()

    class Meta:
        app_label = "shop"
