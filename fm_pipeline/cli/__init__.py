"""The `fm` command line (fm_pipeline.cli.main:app)."""

import os
import sys

# Piped or logged output (CI, `make demo | tee`) gets 120 columns instead of rich's 80, so
# report tables stay readable; a terminal keeps its own width. Set here, before any
# sub-command module creates its console.
if not sys.stdout.isatty():
    os.environ.setdefault("COLUMNS", "120")
