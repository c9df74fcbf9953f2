"""Grafana dashboards generated with grafanalib. (Arrives with the dashboards issue.)"""
