"""`python -m rfdetr_extensions`: print the speedup registry as the Markdown table README.md carries."""

from rfdetr_extensions import markdown_table

print(markdown_table())
