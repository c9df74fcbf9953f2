"""Grafana dashboards and Prometheus rules generated from servemon's schema."""
