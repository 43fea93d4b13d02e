"""Training: the route a machine takes, rfdetr's call, resuming, the epoch blocks and the compile warm-up."""
