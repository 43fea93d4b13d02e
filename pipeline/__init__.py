"""What the workflow's stages share: config checks, training blocks, the recipe, resuming, the dataset, GPU profiles.

Nothing here runs on its own: the stage entry points in `scripts/` and `rules/common.smk` import it.
"""
