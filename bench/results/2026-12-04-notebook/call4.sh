#!/usr/bin/env bash
# The notebook's recipe again on a fresh machine (call 3 was taken back mid-run): call 1 repeated, its files named
# stock2 so that the two runs can sit side by side.
set -u
cd "$(dirname "$0")/../../.."
bash bench/results/2026-12-04-notebook/call1.sh
for f in summary-stock.json stock-stock.log stock-run.txt; do mv "$OUT/$f" "$OUT/${f/stock/stock2}"; done
rm -f "$OUT"/env-*
