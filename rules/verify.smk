rule verify_counts:
    input:
        expand(DATASET / "{folder}", folder=FOLDERS),
    output:
        RESULTS / "verify" / "dataset.json",
    log:
        LOGS / "verify" / "dataset.log",
    benchmark:
        BENCHMARKS / "verify" / "dataset.tsv"
    conda:
        "../envs/pipeline.yaml"
    threads: 16  # capped at --cores on one machine; set-threads in a cluster profile
    resources:
        mem_mb=SETTINGS.resources.verify_mem_mb,
    params:
        # not read by the job (its settings say them): here so that a change checks the data again
        expected=json.dumps(SETTINGS.verify.expected_images.model_dump()),
        decode="--decode" if SETTINGS.verify.decode_images else "",
        dataset=DATASET,
    message:
        "Verifying image counts and annotations in {params.dataset}"
    shell:
        "verify.py --dataset {params.dataset:q} --workers {threads} --report {output:q} "
        "2>&1 | tee {log:q}"
