"""Integrations with training frameworks that have no ``prepare()`` of their own."""
