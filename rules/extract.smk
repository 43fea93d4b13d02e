rule extract_archive:
    input:
        lambda w: archive_path(ARCHIVE_OF_FOLDER[w.folder]),
    output:
        directory(DATASET / "{folder}"),
    log:
        LOGS / "extract" / "{folder}.log",
    benchmark:
        BENCHMARKS / "extract" / "{folder}.tsv"
    conda:
        "../envs/pipeline.yaml"
    threads: 16  # capped at --cores on one machine; set-threads in a cluster profile
    resources:
        mem_mb=config["resources"]["extract_mem_mb"],
    params:
        dataset=DATASET,
    message:
        "Extracting {input} into {output}"
    shell:
        "python -m scripts.extract --archive {input:q} --target {params.dataset:q} "
        "--folder {wildcards.folder} --workers {threads} 2>&1 | tee {log:q}"
