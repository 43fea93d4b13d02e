rule download_archive:
    input:
        previous_extraction,
    output:
        archive_path("{archive}")
        if config["extract"]["keep_archives"]
        else temp(archive_path("{archive}")),
    log:
        LOGS / "download" / "{archive}.log",
    benchmark:
        BENCHMARKS / "download" / "{archive}.tsv"
    conda:
        "../envs/pipeline.yaml"
    resources:
        mem_mb=config["resources"]["download_mem_mb"],
    params:
        url=lambda w: config["archives"][w.archive]["url"],
        md5=lambda w: config["archives"][w.archive]["md5"],
    message:
        "Downloading {wildcards.archive} (resumable; log: {log})"
    shell:
        "python -m scripts.download --archive {wildcards.archive} --url {params.url:q} "
        "--md5 {params.md5} --output {output:q} 2>&1 | tee {log:q}"
