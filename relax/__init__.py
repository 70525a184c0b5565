"""Relax: an RL post-training engine for LLMs.

Importing this package is cheap and starts nothing; heavy modules (torch, ray,
transformers) are imported by the components that need them.
"""

__version__ = "0.1.0"
