"""Lightning callbacks added to the Trainer that rfdetr's `train()` builds (`rfdetr_extensions.trainer_hook`).

`block_end` and `epoch_log` are the workflow's own, used in every training; `static_cuda_graphs`, `gc_freeze` and
`next_epoch_during_validation` are speedups of the registry (`rfdetr_extensions.SPEEDUPS`).
"""
