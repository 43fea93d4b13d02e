"""Speedups that are Lightning callbacks, added to the Trainer that rfdetr's `train()` builds (the registry:
`rfdetr_coco_pipeline.hooks.SPEEDUPS`)."""
