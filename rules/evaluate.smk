rule evaluate:
    input:
        weights=last_block_output("best.pth"),
        run=last_block_output("run.json"),
        dataset=ancient(RESULTS / "verify" / "dataset.json"),
    output:
        metrics=EVAL / "metrics.json",
        per_class=EVAL / "per_class.csv",
        figure=report(
            EVAL / "per_class.png",
            caption="../report/per_class.rst",
            category="Evaluation",
        ),
        page=report(
            EVAL / "metrics.html",
            caption="../report/evaluation.rst",
            category="Evaluation",
        ),
    log:
        LOGS / "evaluate" / "evaluate.log",
    benchmark:
        BENCHMARKS / "evaluate" / "evaluate.tsv"
    conda:
        "../envs/pipeline.yaml"
    threads: 16  # capped at --cores on one machine; set-threads in a cluster profile
    resources:
        gpu=1 if ON_GPU else 0,
        mem_mb=SETTINGS.resources.evaluate_mem_mb,
        runtime=SETTINGS.resources.evaluate_minutes,
    params:
        dataset=DATASET,
    message:
        "Evaluating the best weights on val2017 (log: {log})"
    shell:
        "evaluate.py --weights {input.weights:q} --run {input.run:q} --dataset {params.dataset:q} "
        "--metrics {output.metrics:q} --per-class {output.per_class:q} --figure {output.figure:q} --page {output.page:q} "
        "--workers {threads} 2>&1 | tee {log:q}"
