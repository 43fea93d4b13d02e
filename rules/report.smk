rule front_page:
    input:
        summary=RESULTS / "plots" / "summary.txt",
        evaluation=EVAL / "metrics.json",
        figure=RESULTS / "plots" / "training.png",
    output:
        FRONT_PAGE,
    log:
        LOGS / "report" / "front_page.log",
    benchmark:
        BENCHMARKS / "report" / "front_page.tsv"
    # A page of text from three files: where snakemake runs, not worth a cluster job.
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    resources:
        mem_mb=SETTINGS.resources.plot_mem_mb,
    message:
        "Writing the report's first page: the run's headline (log: {log})"
    shell:
        "front_page.py --summary {input.summary:q} --evaluation {input.evaluation:q} --figure {input.figure:q} "
        "--output {output:q} 2>&1 | tee {log:q}"
