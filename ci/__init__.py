"""CI helpers: the scenario gate (``python -m ci.gate``), baselines, workflow templates, wheelhouse."""
