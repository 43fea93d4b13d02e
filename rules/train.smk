# Staging runs inside each training job, not as a job of its own: /dev/shm belongs to the node that
# trains (and a reboot empties it), so only the training job can know the copy is there.
rule train_block:
    input:
        # The previous block's outputs, and (ancient: re-verifying the same data, which gives it a new
        # mtime, must not retrain; a recipe change does, through params) the dataset report.
        unpack(previous_block),
        dataset=ancient(RESULTS / "verify" / "dataset.json"),
        compile_warmup=compile_warmup_report,
    output:
        **block_outputs("{block}"),
    log:
        stage=LOGS / "train" / "{block}.stage.log",
        train=LOGS / "train" / "{block}.log",
    benchmark:
        BENCHMARKS / "train" / "{block}.tsv"
    conda:
        "../envs/pipeline.yaml"
    threads: training_job_cores(SETTINGS)  # capped at --cores on one machine
    resources:
        gpu=SETTINGS.recipe.gpus,
        mem_mb=train_mem_mb,
        runtime=train_runtime,
    # Snakemake reruns a job whose params changed: these are the params of 0.4.0's rule, value for value, so that
    # a run started then resumes. `start` and `state` say what the job reads from its settings.
    params:
        recipe=RECIPE,
        first=lambda w: BLOCKS[w.block][0] + 1,
        start=lambda w: BLOCKS[w.block][0],
        end=lambda w: BLOCKS[w.block][1],
        previous=lambda w, input: (
            Path(input.checkpoint).parent if "checkpoint" in input.keys() else ""
        ),
        dataset=DATASET,
        state=PATHS.state,
        outdir=lambda w: TRAIN / w.block,
    message:
        "Training epochs {params.first}-{params.end} ({wildcards.block}; log: {log.train})"
    shell:
        "stage.py --source {params.dataset:q} --report {output.stage:q} "
        "--workers {threads} 2>&1 | tee {log.stage:q} && "
        "train.py --block {wildcards.block} --stage-report {output.stage:q} "
        "--previous-block={params.previous:q} --outdir {params.outdir:q} --threads {threads} 2>&1 | tee {log.train:q}"
