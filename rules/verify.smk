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
        mem_mb=config["resources"]["verify_mem_mb"],
    params:
        dataset=DATASET,
        expected=json.dumps(config["verify"]["expected_images"]),
        decode="--decode" if config["verify"]["decode_images"] else "",
    message:
        "Verifying image counts and annotations in {params.dataset}"
    shell:
        "python -m scripts.verify_counts --dataset {params.dataset:q} --expected {params.expected:q} "
        "{params.decode} --workers {threads} --report {output:q} 2>&1 | tee {log:q}"
