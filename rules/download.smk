rule download_archive:
    input:
        download_after,
    output:
        # update: Snakemake leaves an archive that appeared since the run began (another run sharing data_dir
        # fetched it) for the job, which uses it instead of fetching it again
        update(archive_path("{archive}"))
        if SETTINGS.extract.keep_archives
        else temp(update(archive_path("{archive}"))),
    log:
        LOGS / "download" / "{archive}.log",
    benchmark:
        BENCHMARKS / "download" / "{archive}.tsv"
    # only the archives that are not in data_dir already, placed by hand: those are nobody's output, never deleted
    wildcard_constraints:
        archive=DOWNLOADED_ARCHIVES,
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
