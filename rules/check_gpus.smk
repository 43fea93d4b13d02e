rule check_gpus:
    output:
        GPU_CHECK,
    log:
        LOGS / "preflight" / "gpus.log",
    benchmark:
        BENCHMARKS / "preflight" / "gpus.tsv"
    # A missing GPU does not come back on a second try: the run stops at the first answer, not after the profile's
    # retries (up to four tries on SLURM).
    retries: 0
    # Runs where training will run (a GPU node of a cluster), unless there is nothing to look for.
    localrule: not checks_gpus(SETTINGS)
    conda:
        "../envs/pipeline.yaml"
    resources:
        gpu=SETTINGS.recipe.gpus if checks_gpus(SETTINGS) else 0,
        mem_mb=SETTINGS.resources.download_mem_mb,
        runtime=10,
    message:
        "Checking that the GPUs training needs are there (log: {log})"
    shell:
        "check_gpus.py --report {output:q} 2>&1 | tee {log:q}"
