"""``python -m rlkube_devcluster``: what ``make cluster`` runs."""

from __future__ import annotations

import sys

from rlkube_devcluster.cli import main

sys.exit(main())
