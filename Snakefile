# RF-DETR Nano trained from scratch on COCO2017: download -> extract -> verify -> (stage + train blocks) -> plot,
# evaluate, export. README.md says how to run it; config.yaml holds every setting.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


# Validates the config first: an invalid value stops here, before any job, naming the key.
include: "rules/common.smk"
include: "rules/check_gpus.smk"
include: "rules/download.smk"
include: "rules/extract.smk"
include: "rules/verify.smk"
include: "rules/compile_warmup.smk"
include: "rules/train.smk"
include: "rules/plot.smk"
include: "rules/evaluate.smk"
include: "rules/export.smk"
include: "rules/report.smk"


# The report opens on the finished run's headline; on the workflow's description before.
report: str(FRONT_PAGE.absolute()) if FRONT_PAGE.exists() else "report/workflow.rst"


rule all:
    default_target: True
    input:
        # The training outputs are final targets too, so a failed retrain can't leave an old plot looking current.
        final_targets(),
