"""The autoscaler's YAML schema (`config`), its pure policy (`policy`) and the shipped default (autoscaler.yaml).

The loop that reads a running job's signals and scales its fleet is relax/core/autoscaler.py.
"""
