"""Deployment tests: Prometheus/Grafana monitoring, Slurm, Helm (need their system binaries)."""
