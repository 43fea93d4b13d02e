rule export_model:
    input:
        weights=last_block_output("best.pth"),
    output:
        EXPORT / "model.{format}",
    log:
        LOGS / "export" / "{format}.log",
    benchmark:
        BENCHMARKS / "export" / "{format}.tsv"
    conda:
        "../envs/pipeline.yaml"
    resources:
        mem_mb=SETTINGS.resources.export_mem_mb,
    message:
        "Exporting the best weights to {wildcards.format} (log: {log})"
    shell:
        "export.py --weights {input.weights:q} --format {wildcards.format} --output {output:q} "
        "2>&1 | tee {log:q}"
