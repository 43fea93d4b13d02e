rule extract_archive:
    input:
        lambda w: archive_path(ARCHIVE_NAMES[FOLDERS.index(w.folder)]),
    output:
        # update: Snakemake leaves a folder that appeared since the run began (another run sharing data_dir
        # extracted it) for the job, which uses it instead of extracting again
        update(directory(DATASET / "{folder}")),
    log:
        LOGS / "extract" / "{folder}.log",
    benchmark:
        BENCHMARKS / "extract" / "{folder}.tsv"
    localrule: runs_here("extract_archive")
    conda:
        "../envs/pipeline.yaml"
    threads: 16  # capped at --cores on one machine; set-threads in a cluster profile
    resources:
        mem_mb=SETTINGS.resources.extract_mem_mb,
    message:
        "Extracting {input} into {output}"
    shell:
        "extract.py --archive {input:q} --output {output:q} --workers {threads} "
        "2>&1 | tee {log:q}"
