"""Reports built from a results JSON alone: HTML with embedded plots, and a rich terminal summary."""

from harness.report.html import write_html
from harness.report.terminal import render_summary

__all__ = ["render_summary", "write_html"]
