rule plot_metrics:
    input:
        blocks=expand(
            TRAIN / "{block}" / "{name}",
            block=BLOCKS,
            name=["metrics.csv", "epochs.json", "run.json"],
        ),
    output:
        metrics=RESULTS / "metrics.csv",
        training=report(
            RESULTS / "plots" / "training.png",
            caption="../report/training.rst",
            category="Training",
        ),
        loss=report(
            RESULTS / "plots" / "loss.png",
            caption="../report/loss.rst",
            category="Training",
        ),
        map=report(
            RESULTS / "plots" / "map.png",
            caption="../report/map.rst",
            category="Training",
        ),
        summary=report(
            RESULTS / "plots" / "summary.txt",
            caption="../report/summary.rst",
            category="Training",
        ),
        epochs_page=report(
            RESULTS / "report" / "epochs.html",
            caption="../report/epochs.rst",
            category="Training",
        ),
        run_page=report(
            RESULTS / "report" / "run.html",
            caption="../report/run.rst",
            category="Run",
        ),
    log:
        LOGS / "plot" / "plot.log",
    benchmark:
        BENCHMARKS / "plot" / "plot.tsv"
    conda:
        "../envs/pipeline.yaml"
    resources:
        mem_mb=SETTINGS.resources.plot_mem_mb,
    params:
        blocks=[TRAIN / block for block in BLOCKS],
    message:
        "Plotting loss and mAP from {output.metrics}"
    shell:
        "plot.py --blocks {params.blocks:q} --metrics {output.metrics:q} --training-plot {output.training:q} "
        "--loss-plot {output.loss:q} --map-plot {output.map:q} --summary {output.summary:q} "
        "--epochs-page {output.epochs_page:q} --run-page {output.run_page:q} 2>&1 | tee {log:q}"
