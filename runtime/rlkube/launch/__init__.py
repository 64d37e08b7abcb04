"""Launchers: ``run`` (``rlkube run``: validate, resolve, run, report) and ``progress`` (the terminal)."""
