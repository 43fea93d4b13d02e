"""The dataset stages: download, extract, verify, and the RAM-disk copy training reads."""
