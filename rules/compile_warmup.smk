# Compiles the training step's graphs into the run's compile cache once val2017 is extracted, beside the
# train2017 download, so that the first training job finds them there.
rule compile_warmup:
    input:
        # ancient: extracting the same data again must not compile again; a recipe change does, through params.
        annotations=ancient(DATASET / "annotations"),
        images=ancient(DATASET / "val2017"),
    output:
        TRAIN / "compile_warmup.json",
    log:
        LOGS / "train" / "compile_warmup.log",
    benchmark:
        BENCHMARKS / "train" / "compile_warmup.tsv"
    conda:
        "../envs/pipeline.yaml"
    # Its data-loader workers. The compile's own worker processes run beside the download, which needs the
    # network rather than cores: reserving more here would hold back the extraction that follows it.
    threads: 2
    resources:
        gpu=1 if ON_GPU else 0,
        mem_mb=SETTINGS.resources.compile_warmup_mem_mb,
        runtime=SETTINGS.resources.compile_warmup_minutes,
    params:
        recipe=RECIPE,
        dataset=DATASET,
    message:
        "Compiling the training step's graphs ahead of training (log: {log})"
    shell:
        "compile_warmup.py --dataset {params.dataset:q} --report {output:q} "
        "--threads {threads} 2>&1 | tee {log:q}"
