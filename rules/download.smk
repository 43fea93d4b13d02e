rule download_archive:
    input:
        download_after,
    output:
        archive_path("{archive}")
        if SETTINGS.extract.keep_archives
        else temp(archive_path("{archive}")),
    log:
        LOGS / "download" / "{archive}.log",
    benchmark:
        BENCHMARKS / "download" / "{archive}.tsv"
    localrule: runs_here("download_archive")
    conda:
        "../envs/pipeline.yaml"
    resources:
        mem_mb=SETTINGS.resources.download_mem_mb,
    params:
        # not read by the job (its settings say them): here so that a new url or md5 fetches the archive again
        url=lambda w: SETTINGS.archive(w.archive).url,
        md5=lambda w: SETTINGS.archive(w.archive).md5,
    message:
        "Downloading {wildcards.archive} (resumable; log: {log})"
    shell:
        "download.py --archive {wildcards.archive} --output {output:q} 2>&1 | tee {log:q}"
