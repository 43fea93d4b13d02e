"""Speedups that replace one private rfdetr function or method inside a `with` block (`rfdetr_extensions.SPEEDUPS`)."""
