# Staging runs inside each training job, not as a job of its own: /dev/shm belongs to the node that
# trains (and a reboot empties it), so only the training job can know the copy is there.
# With srun's launch, srun stages once on every node of the job, then starts one training task per GPU; a task
# that fails ends the others (--kill-on-bad-exit), rather than leaving them waiting for it. Each srun names its
# layout: the SLURM plugin clears the allocation's task settings from the job's environment.
NODES, GPUS = SETTINGS.recipe.nodes, SETTINGS.recipe.gpus
STAGE_ON_EVERY_NODE = (
    f"{{resources.mpi}} --nodes={NODES} --ntasks={NODES} --ntasks-per-node=1 "
    "--cpus-per-task={resources.cpus_per_task} "
    if SETTINGS.srun_launch
    else ""
)
RANKS_ON_EVERY_NODE = (
    f"{{resources.mpi}} --nodes={NODES} --ntasks={SETTINGS.recipe.ranks} --ntasks-per-node={GPUS} "
    "--cpus-per-task={resources.cpus_per_task} --kill-on-bad-exit=1 "
    if SETTINGS.srun_launch
    else ""
)


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
        # one process per GPU, started by Lightning or by srun (docs/cluster.md)
        **training_launch_resources(SETTINGS),
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
        STAGE_ON_EVERY_NODE
        + "stage.py --source {params.dataset:q} --report {output.stage:q} "
        "--workers {threads} 2>&1 | tee {log.stage:q} && "
        + RANKS_ON_EVERY_NODE
        + "train.py --block {wildcards.block} --stage-report {output.stage:q} "
        "--previous-block={params.previous:q} --outdir {params.outdir:q} --threads {threads} 2>&1 | tee {log.train:q}"
