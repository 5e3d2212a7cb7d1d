"""Exporters: the offline HTML report (and, later, Prometheus)."""
