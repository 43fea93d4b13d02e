"""Speedups that replace private rfdetr (or Lightning) functions or methods inside a `with` block (the registry:
`rfdetr_coco_pipeline.hooks.SPEEDUPS`)."""
